//! The pure core: plain data and plain functions, no IO, no runtime.

pub mod alert;
pub mod backoff;
pub mod control_planes;
pub mod detect;
pub mod drain_holds;
pub mod engine;
pub mod etcd_roll;
pub mod event;
pub mod gate;
pub mod k8s_upgrade;
pub mod node_cycle;
pub mod roll_watch;
pub mod run;
pub mod schedule;
pub mod scope;
pub mod self_silence;
pub mod step;
pub mod version;
