//! The pure core: plain data and plain functions, no IO, no runtime.

pub mod alert;
pub mod detect;
pub mod engine;
pub mod etcd_roll;
pub mod event;
pub mod gate;
pub mod plan;
pub mod run;
pub mod version;
