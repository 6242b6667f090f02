//! Adapters: the ports implemented against real systems.

pub mod etcd;
pub mod notify;
pub mod prometheus;
