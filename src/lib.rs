//! rollgate: safe, gated, event-driven Kubernetes version upgrades and etcd rolls.

pub mod adapters;
pub mod app;
pub mod cli;
pub mod config;
pub mod detect;
pub mod domain;
pub mod etcd_roll;
pub mod etcd_roll_steps;
pub mod gate;
pub mod http;
pub mod metrics;
pub mod ports;
pub mod queue;
pub mod store;
pub mod upgrade;
pub mod worker;
