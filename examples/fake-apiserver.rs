//! The test suite's fake Kubernetes API server as a program, to point kubectl or rollgate
//! at by hand:
//!
//! ```text
//! cargo run --example fake-apiserver -- --listen 127.0.0.1:6443 --nodes 3 --pods-per-node 4 \
//!     --pdb maxUnavailable=50%
//! ```
//!
//! Nodes `node-1` … `node-N` each hold M pods in namespace `default`, labelled `app=web`
//! and owned by a ReplicaSet (evicted, they are made again on another schedulable node);
//! `--control-planes C` makes the first C of them control planes instead (no app pods);
//! `--pdb` puts one PodDisruptionBudget `web` over `app=web`. The first line printed is
//! the path of a kubeconfig for the server; it serves until killed.
#![allow(dead_code)]

#[path = "../tests/support/kube/mod.rs"]
mod kube;

use clap::Parser;
use serde_json::{Value, json};

#[derive(Parser)]
#[command(about = "The fake Kubernetes API server of rollgate's tests")]
struct Args {
    /// Where to listen, host:port.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// How many nodes (node-1 … node-N).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// How many of them, from node-1 on, are control planes (tainted: no app pods, and
    /// their kube-apiserver, controller-manager and scheduler mirror pods), for
    /// `rollgate plan` and upgrades.
    #[arg(long, default_value_t = 0)]
    control_planes: usize,
    /// How many app=web pods on each node.
    #[arg(long, default_value_t = 2)]
    pods_per_node: usize,
    /// One PodDisruptionBudget `web` over app=web: minAvailable=X or maxUnavailable=Y,
    /// an integer or a percentage.
    #[arg(long)]
    pdb: Option<String>,
}

/// `minAvailable=2`, `maxUnavailable=50%` as a budget's spec.
fn budget_spec(text: &str) -> Result<Value, String> {
    let (field, value) = text
        .split_once('=')
        .ok_or_else(|| format!("--pdb {text:?}: expected minAvailable=X or maxUnavailable=Y"))?;
    if field != "minAvailable" && field != "maxUnavailable" {
        return Err(format!(
            "--pdb {text:?}: the field is minAvailable or maxUnavailable"
        ));
    }
    let amount =
        match value.strip_suffix('%') {
            Some(pct) if pct.parse::<u8>().is_ok_and(|p| p <= 100) => json!(value),
            Some(_) => return Err(format!("--pdb {text:?}: a percentage is 0% to 100%")),
            None => json!(value.parse::<u32>().map_err(|_| format!(
                "--pdb {text:?}: {value:?} is not a count or a percentage"
            ))?),
        };
    Ok(json!({field: amount, "selector": {"matchLabels": {"app": "web"}}}))
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let spec = match args.pdb.as_deref().map(budget_spec).transpose() {
        Ok(spec) => spec,
        Err(why) => {
            eprintln!("fake-apiserver: {why}");
            std::process::exit(2);
        }
    };
    let fake = kube::FakeKube::start_on(&args.listen).await;
    fake.add_namespace("default");
    fake.add_namespace("kube-system");
    for n in 1..=args.nodes {
        let node = format!("node-{n}");
        let control_plane = n <= args.control_planes;
        fake.add_node(&node, control_plane, "1.34.2", "1.7.24");
        if control_plane {
            fake.add_static_pods(&node, "1.34.2", false);
        } else {
            fake.add_pods(&node, "web", args.pods_per_node, false);
        }
    }
    if let Some(spec) = spec {
        fake.add_pdb("web", spec);
    }
    let dir = std::env::temp_dir().join(format!("fake-apiserver-{}", fake.port));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("fake-apiserver: cannot make {}: {e}", dir.display());
        std::process::exit(1);
    }
    let kubeconfig = dir.join("kubeconfig");
    fake.write_tls_kubeconfig(&kubeconfig);
    println!("{}", kubeconfig.display());
    eprintln!(
        "fake-apiserver: serving https://127.0.0.1:{} (and plain {}) with {} nodes and {} pods each; kubectl --kubeconfig {} get nodes",
        fake.tls_port,
        fake.url(),
        args.nodes,
        args.pods_per_node,
        kubeconfig.display()
    );
    std::future::pending::<()>().await;
}
