//! The node-reboot workflow, in one place: its planning (pure: `plan`) and its steps
//! (through the ports: `steps`), and the reboot itself (`action`), which an upgrade
//! also asks inside a node's drain. The node cycle it shares with upgrades lives in
//! `workflows::node_cycle::plan` (planning) and `workflows::node_cycle` (acting).

mod action;
pub mod config;
pub mod dry_run;
pub mod intake;
pub mod metrics;
pub mod plan;
pub mod request;
pub mod step;
mod steps;

pub use action::{NodeReboots, RebootAction, SentinelError, sentinel};
pub use plan::{RebootPlanError, RebootPlanSettings, check_request};
pub use request::RebootRequest;
pub use steps::RebootSteps;
