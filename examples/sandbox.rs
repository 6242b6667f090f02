//! The sandbox: a small cluster on this machine to run rollgate against, made of the test
//! ground's own parts (`tests/support`): the fake API server, nodes behind real sshd with
//! the stub tools, real etcd, Prometheus with the shipped rules, Alertmanager pointed at
//! rollgate, a Pushgateway. Every duration is scaled by one factor, as in a rehearsal.
//!
//! `cargo run --example sandbox -- --dir sandbox` brings it up, writes
//! `sandbox/rollgate.toml` and `sandbox/env`, prints "sandbox ready" and runs until Ctrl-C
//! (or SIGTERM), when it stops everything it started. `scripts/serve.sh` runs it with
//! `rollgate serve` beside it.

#[path = "../tests/support/mod.rs"]
mod support;

use clap::Parser;
use std::path::PathBuf;
use support::rehearsal::Scale;
use support::sandbox::{Options, Sandbox};

/// A local sandbox cluster for rollgate.
#[derive(Parser, Debug)]
struct Args {
    /// Where its files go (rollgate.toml, env, tokens, rollgate's data).
    #[arg(long, default_value = "sandbox")]
    dir: PathBuf,
    /// Control planes, each with its stacked etcd member.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=5))]
    control_planes: u16,
    /// Workers, on one sshd, each at its own loopback address.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u16).range(1..=2000))]
    workers: u16,
    /// Workers in hand at once: a count (`2`) or a share (`10%`).
    #[arg(long, default_value = "2")]
    max_unavailable: String,
    /// The Kubernetes version every node runs at first.
    #[arg(long, default_value = "1.34.2")]
    kubelet: String,
    /// The loopback port rollgate will listen on.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Nodes whose reboot sentinel is set from the start, comma-separated.
    #[arg(long, value_delimiter = ',')]
    needing_reboot: Vec<String>,
    /// Real time over sandbox time: 120 makes a 10-minute soak 5 s.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u32).range(1..=3600))]
    time_divisor: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Err(e) = rollgate::domain::version::Version::parse(&args.kubelet) {
        anyhow::bail!("--kubelet {:?}: {e}", args.kubelet);
    }
    let workers: Vec<String> = (1..=args.workers).map(|i| format!("w{i}")).collect();
    if let Some(unknown) = args.needing_reboot.iter().find(|n| !workers.contains(n)) {
        anyhow::bail!(
            "--needing-reboot {unknown:?} is not a worker (w1..w{})",
            args.workers
        );
    }
    let dir = std::path::absolute(&args.dir)?;
    let sandbox = Sandbox::start(Options {
        control_planes: args.control_planes.into(),
        workers: args.workers.into(),
        kubelet: args.kubelet,
        rollgate_port: args.port,
        dir,
        needing_reboot: args.needing_reboot,
        max_unavailable: args.max_unavailable,
        scale: Scale(1.0 / f64::from(args.time_divisor)),
    })
    .await;
    println!(
        "sandbox: up in {:.1} s: {} control plane(s), {} workers at v{}; Prometheus {}, Alertmanager {}",
        sandbox.started_in.as_secs_f64(),
        sandbox.options.control_planes,
        sandbox.options.workers,
        sandbox.options.kubelet,
        sandbox.prometheus_port,
        sandbox.alertmanager_url(),
    );
    println!(
        "sandbox: rollgate's configuration: {}",
        sandbox.config_file().display()
    );
    println!("sandbox ready");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    println!("sandbox: stopping");
    drop(sandbox);
    Ok(())
}
