//! Adapters: the ports implemented against real systems.

pub mod notify;
pub mod prometheus;
