//! The pure core: plain data and plain functions, no IO, no runtime.

pub mod alert;
pub mod backoff;
pub mod budget;
pub mod engine;
pub mod event;
pub mod gate;
pub mod kured_lock;
pub mod run;
pub mod schedule;
pub mod scope;
pub mod self_silence;
pub mod step;
pub mod version;
