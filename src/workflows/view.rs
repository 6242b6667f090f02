//! What a workflow shows on the API beside its runs: a read-only `GET /v1/<path>` it
//! answers from its own state. The workflow declares the view (`ViewDoor`: its route,
//! what it says, the schema of its answer) and the thing that answers it (`View`); the
//! HTTP API serves and describes every view the same way.

use serde_json::Value;

use crate::domain::run_request::NamedSchemas;

/// A view as the API lists it: registering one is its line in `workflows::VIEWS`.
#[derive(Debug)]
pub struct ViewDoor {
    /// Its route under `/v1`, e.g. `fleet` for `GET /v1/fleet` (needs scope `read`).
    pub path: &'static str,
    /// One sentence for the API's description.
    pub summary: &'static str,
    /// The schema of the answer.
    pub body: fn() -> NamedSchemas,
}

/// What answers a view: the workflow's part that holds what it shows.
#[async_trait::async_trait]
pub trait View: Send + Sync {
    /// The view it answers.
    fn door(&self) -> &'static ViewDoor;

    /// The answer now, as JSON of the door's `body` schema.
    async fn read(&self) -> Result<Value, serde_json::Error>;
}
