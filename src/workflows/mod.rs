//! The acting halves of the workflows. Each pairs with its pure half in `domain` (same
//! name) and reaches the world only through `ports`: what to do is decided in `domain`,
//! done here, and talked to other systems by `adapters`, wired by `app`.

pub mod control_plane_cycle;
pub mod detect;
pub mod etcd_roll;
pub mod events;
pub mod fleet;
pub mod gate;
pub mod k8s_upgrade;
pub mod leader;
pub mod node_cycle;
pub mod node_reboot;
pub mod outbox;
