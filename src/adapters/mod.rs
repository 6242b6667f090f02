//! Adapters: the ports implemented against real systems.

pub mod alertmanager;
pub mod channels;
pub mod etcd;
pub mod fleet_peer;
pub mod http_client;
pub mod kube;
pub mod notify;
pub mod prometheus;
pub mod pushgateway;
pub mod repo;
pub mod shell;
pub mod snapshot;
pub mod ssh;
pub mod submit;
