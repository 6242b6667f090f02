//! The node-reboot workflow, in one place: its planning (pure: `plan`) and its steps
//! (through the ports: `steps`). The node cycle it shares with upgrades lives in
//! `domain::node_cycle` (planning) and `workflows::node_cycle` (acting).

pub mod plan;
mod steps;

pub use plan::{RebootPlanError, RebootPlanSettings, check_request};
pub use steps::{RebootSettings, RebootSteps};
