//! An independent witness of etcd's leadership: the test samples every member's raft term
//! and leader itself, all along a roll, instead of believing what rollgate reports.

use rollgate::adapters::etcd::Etcd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One sample: the highest raft term a member answered with, and the leader a member at
/// that term follows (0: none known).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    term: u64,
    leader: u64,
}

/// Samples the members every 50 ms from `start` until `stop`.
pub struct RaftWitness {
    etcd: Arc<Etcd>,
    samples: Arc<Mutex<Vec<Sample>>>,
    done: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

/// What the witness saw.
#[derive(Debug)]
pub struct Witnessed {
    /// The term when sampling started.
    pub first_term: u64,
    /// The term when it stopped.
    pub last_term: u64,
    /// The leaders one after another, each once per stretch it led.
    pub leaders: Vec<u64>,
}

impl Witnessed {
    /// How far the raft term rose: every leadership change, moved or elected, is one.
    pub fn term_rise(&self) -> u64 {
        self.last_term - self.first_term
    }

    /// How many times another member took the lead.
    pub fn leader_changes(&self) -> usize {
        self.leaders.len().saturating_sub(1)
    }
}

async fn sample(etcd: &Etcd) -> Option<Sample> {
    let answers = etcd.answering().await;
    let term = answers.iter().map(|s| s.raft_term).max()?;
    let leader = answers
        .iter()
        .filter(|s| s.raft_term == term)
        .map(|s| s.leader)
        .find(|l| *l != 0)
        .unwrap_or(0);
    Some(Sample { term, leader })
}

/// Samples until one shows a leader, or panics after 30 s.
async fn settled(etcd: &Etcd) -> Sample {
    let started = Instant::now();
    loop {
        if let Some(s) = sample(etcd).await.filter(|s| s.leader != 0) {
            return s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no etcd leader within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl RaftWitness {
    /// Starts sampling through `etcd` (a client of every member); the first sample shows a
    /// leader.
    pub async fn start(etcd: Etcd) -> Self {
        let etcd = Arc::new(etcd);
        let first = settled(&etcd).await;
        let samples = Arc::new(Mutex::new(vec![first]));
        let done = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (etcd, samples, done) = (etcd.clone(), samples.clone(), done.clone());
            async move {
                while !done.load(Ordering::Relaxed) {
                    if let Some(s) = sample(&etcd).await {
                        samples.lock().unwrap().push(s);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
        Self {
            etcd,
            samples,
            done,
            task,
        }
    }

    /// Stops sampling once the cluster has a leader again, and tells what was seen.
    pub async fn stop(self) -> Witnessed {
        self.done.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        let last = settled(&self.etcd).await;
        let mut samples = self.samples.lock().unwrap().clone();
        samples.push(last);
        let mut leaders: Vec<u64> = Vec::new();
        for s in samples.iter().filter(|s| s.leader != 0) {
            if leaders.last() != Some(&s.leader) {
                leaders.push(s.leader);
            }
        }
        Witnessed {
            first_term: samples[0].term,
            last_term: last.term,
            leaders,
        }
    }
}
