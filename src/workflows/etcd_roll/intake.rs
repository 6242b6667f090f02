//! The etcd roll's door: `POST /v1/etcd-rolls` and `rollgate.etcd-roll.v1`. The members a
//! request names are reached and checked before the roll is taken; a watched StatefulSet's
//! new revision asks through the same checks.

use chrono::{DateTime, Utc};
use serde_json::Value;
use std::sync::Arc;

use super::request::EtcdRollRequest;
use crate::domain::input::FieldErrors;
use crate::domain::run::Run;
use crate::domain::run_request::{RunDoor, RunPolicy, RunRequest, schema_of};
use crate::domain::scope::Scope;
use crate::ports::EtcdConnect;
use crate::workflows::etcd_roll::roll_watch::WatchTarget;
use crate::workflows::intake::{Admit, Intake, Refusal};

/// Where etcd rolls are asked for.
pub static DOOR: RunDoor = RunDoor {
    steps: super::step::STEPS,
    path: "etcd-rolls",
    scope: Scope::new("etcd-rolls:write"),
    event_type: "rollgate.etcd-roll.v1",
    routing_key: "etcd-rolls",
    label: "etcd-roll",
    read_published: read,
    new_run,
    merge: None,
    one_at_a_time: false,
    summary: "roll the etcd cluster that is a StatefulSet's pods.",
    body: schema_of::<super::request::EtcdRollBody>,
    answers: &[],
};

fn read(body: &Value) -> Result<Arc<dyn RunRequest>, FieldErrors> {
    Ok(Arc::new(EtcdRollRequest::from_json(body)?))
}

fn new_run(
    id: String,
    request: &dyn RunRequest,
    policy: &RunPolicy,
    now: DateTime<Utc>,
) -> Option<Run> {
    let request = request.as_any().downcast_ref::<EtcdRollRequest>()?;
    Some(super::plan::new_run(id, request, policy.on_failure, now))
}

/// What an etcd roll request is checked against.
#[derive(Clone, Default)]
pub struct RollIntake {
    /// Why etcd rolls cannot run here (no Kubernetes API configured), if they cannot.
    pub unavailable: Option<String>,
    /// Whether `etcd_roll.ca_file` is set, so `https://` members can be reached.
    pub tls: bool,
    /// Reaches the members a request names, to check them before the roll is queued.
    pub connect: Option<Arc<dyn EtcdConnect>>,
}

impl RollIntake {
    /// The request that rolls `target` to `revision`: the endpoints are the members'
    /// advertised client URLs, read at `seed`.
    pub async fn watched_request(
        &self,
        target: &WatchTarget,
        seed: &str,
    ) -> Result<Arc<dyn RunRequest>, Refusal> {
        if let Some(why) = &self.unavailable {
            return Err(Refusal::Invalid(why.clone()));
        }
        let Some(connect) = &self.connect else {
            return Err(Refusal::Invalid(
                "no etcd client is configured for rolls".into(),
            ));
        };
        let seeded = connect
            .connect(&[seed.to_owned()])
            .map_err(|e| Refusal::Invalid(e.to_string()))?;
        let members = seeded.members().await.map_err(|e| {
            Refusal::Unavailable(format!("cannot read the member list at {seed}: {e}"))
        })?;
        let endpoints: Vec<String> = members.into_iter().flat_map(|m| m.client_urls).collect();
        let body = serde_json::json!({
            "statefulset": target.name, "namespace": target.namespace, "endpoints": endpoints,
        });
        let request = EtcdRollRequest::from_json(&body).map_err(|e| {
            Refusal::Invalid(format!(
                "the members at {seed} do not make a roll request: {e}"
            ))
        })?;
        Ok(Arc::new(request))
    }
}

#[async_trait::async_trait]
impl Intake for RollIntake {
    fn door(&self) -> &'static RunDoor {
        &DOOR
    }

    async fn admit(&self, request: &Arc<dyn RunRequest>) -> Result<Admit, Refusal> {
        if let Some(why) = &self.unavailable {
            return Err(Refusal::Invalid(why.clone()));
        }
        let uses_tls = request
            .as_any()
            .downcast_ref::<EtcdRollRequest>()
            .is_some_and(EtcdRollRequest::uses_tls);
        if uses_tls && !self.tls {
            return Err(Refusal::Invalid(
                "https endpoints need the CA (and client certificate) files in etcd_roll.ca_file, etcd_roll.cert_file and etcd_roll.key_file".into(),
            ));
        }
        Ok(Admit::New)
    }

    /// The members a roll names must be reachable and answer at the endpoints given: a
    /// member whose advertised client URL is not in the list could never be seen at the
    /// target, so the roll would restart it and then fail.
    async fn check(&self, request: &Arc<dyn RunRequest>) -> Result<(), Refusal> {
        let Some(connect) = &self.connect else {
            return Ok(());
        };
        let Some(request) = request.as_any().downcast_ref::<EtcdRollRequest>() else {
            return Err(Refusal::Invalid("not an etcd roll request".into()));
        };
        let endpoints = &request.endpoints;
        let etcd = connect
            .connect(endpoints)
            .map_err(|e| Refusal::Invalid(e.to_string()))?;
        match super::check_endpoints(&*etcd).await {
            Ok(()) => Ok(()),
            Err(super::RollError::Refused(why)) => Err(Refusal::Invalid(why)),
            Err(e) => Err(Refusal::Unavailable(format!(
                "cannot read the member list at {} to check the request; retry later ({e})",
                endpoints.join(", ")
            ))),
        }
    }
}
