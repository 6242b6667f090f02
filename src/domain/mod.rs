//! The pure core: plain data and plain functions, no IO, no runtime.

pub mod alert;
pub mod analysis;
pub mod backoff;
pub mod breaker;
pub mod budget;
pub mod cohorts;
pub mod distribution;
pub mod engine;
pub mod etcd_order;
pub mod event;
pub mod facts;
pub mod gate;
pub mod input;
pub mod kured_lock;
pub mod pods;
pub mod run;
pub mod run_kind;
pub mod run_request;
pub mod schedule;
pub mod scope;
pub mod self_silence;
pub mod sight;
pub mod step;
pub mod step_kind;
pub mod upgrade_step;
pub mod version;
