//! etcd through etcd-client: one client per member, because a shared client's `status()`
//! answers from whichever endpoint its balancer picks; timeouts on every call; optional
//! TLS (CA, client certificate and key, all read from files).

use etcd_client::{
    AlarmAction, AlarmType, Certificate, Client, ConnectOptions, Identity, TlsOptions,
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

use crate::domain::facts::EtcdAlarm;
use crate::domain::facts::agreed_leader;
use crate::ports::{EtcdConnect, EtcdMembers};
pub use crate::ports::{EtcdError, MemberInfo, MemberStatus};

/// TLS to etcd.
#[derive(Debug, Clone)]
pub struct EtcdTls {
    /// PEM CA bundle that signed the members' certificates.
    pub ca_file: PathBuf,
    /// PEM client certificate, when members require client authentication.
    pub cert_file: Option<PathBuf>,
    /// PEM key of the client certificate.
    pub key_file: Option<PathBuf>,
    /// Name to verify the members' certificates against, when not the endpoint's host.
    pub domain: Option<String>,
}

/// How to reach one etcd cluster.
#[derive(Debug, Clone)]
pub struct EtcdSettings {
    /// One client URL per member, e.g. `https://10.0.0.5:2379`.
    pub endpoints: Vec<String>,
    /// Bound on connecting and on every request.
    pub timeout: Duration,
    /// TLS, when the members serve it.
    pub tls: Option<EtcdTls>,
}

/// One etcd cluster.
pub struct Etcd {
    settings: EtcdSettings,
    options: ConnectOptions,
    clients: Mutex<HashMap<String, Client>>,
}

fn read(path: &PathBuf) -> Result<Vec<u8>, EtcdError> {
    std::fs::read(path).map_err(|e| EtcdError::TlsFile {
        path: path.display().to_string(),
        error: e.to_string(),
    })
}

/// `error` of the member at `endpoint`, with its whole chain of causes (the transport's
/// own message, e.g. "transport error", says little without them).
fn member_error(endpoint: &str, error: etcd_client::Error) -> EtcdError {
    member_said(endpoint, crate::error_chain(&error))
}

fn member_said(endpoint: &str, error: impl std::fmt::Display) -> EtcdError {
    EtcdError::Member {
        endpoint: endpoint.to_owned(),
        error: error.to_string(),
    }
}

impl Etcd {
    /// Reads the TLS files (if any); connects lazily.
    pub fn new(settings: EtcdSettings) -> Result<Self, EtcdError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(settings.timeout)
            .with_timeout(settings.timeout);
        if let Some(tls) = &settings.tls {
            let mut config =
                TlsOptions::new().ca_certificate(Certificate::from_pem(read(&tls.ca_file)?));
            if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
                config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            if let Some(domain) = &tls.domain {
                config = config.domain_name(domain.clone());
            }
            options = options.with_tls(config);
        }
        Ok(Self {
            settings,
            options,
            clients: Mutex::new(HashMap::new()),
        })
    }

    /// A fresh client for `endpoint` with the connect timeout only, for long streams.
    pub async fn streaming_client(&self, endpoint: &str) -> Result<Client, EtcdError> {
        let mut options = self
            .options
            .clone()
            .with_timeout(Duration::from_secs(24 * 3600));
        options = options.with_keep_alive(Duration::from_secs(10), self.settings.timeout);
        let connect = Client::connect([endpoint], Some(options));
        tokio::time::timeout(self.settings.timeout, connect)
            .await
            .map_err(|_| member_said(endpoint, "no connection in time"))?
            .map_err(|e| member_error(endpoint, e))
    }

    /// The bound on connecting and on every request.
    pub fn timeout(&self) -> Duration {
        self.settings.timeout
    }

    /// The configured endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.settings.endpoints
    }

    async fn client(&self, endpoint: &str) -> Result<Client, EtcdError> {
        if let Some(client) = self.clients.lock().await.get(endpoint) {
            return Ok(client.clone());
        }
        let connect = Client::connect([endpoint], Some(self.options.clone()));
        let client = tokio::time::timeout(self.settings.timeout, connect)
            .await
            .map_err(|_| {
                member_said(
                    endpoint,
                    format!("no connection within {:?}", self.settings.timeout),
                )
            })?
            .map_err(|e| member_error(endpoint, e))?;
        self.clients
            .lock()
            .await
            .insert(endpoint.to_owned(), client.clone());
        Ok(client)
    }

    async fn forget(&self, endpoint: &str) {
        self.clients.lock().await.remove(endpoint);
    }

    /// The status of the member at `endpoint`, answered by that member.
    pub async fn status(&self, endpoint: &str) -> Result<MemberStatus, EtcdError> {
        let mut client = self.client(endpoint).await?;
        let answer = tokio::time::timeout(self.settings.timeout, client.status()).await;
        match answer {
            Ok(Ok(s)) => Ok(MemberStatus {
                endpoint: endpoint.to_owned(),
                id: s.header().map_or(0, |h| h.member_id()),
                leader: s.leader(),
                raft_term: s.raft_term(),
                raft_index: s.raft_index(),
                version: s.version().to_owned(),
            }),
            Ok(Err(e)) => {
                self.forget(endpoint).await;
                Err(member_error(endpoint, e))
            }
            Err(_) => {
                self.forget(endpoint).await;
                Err(member_said(
                    endpoint,
                    format!("no status within {:?}", self.settings.timeout),
                ))
            }
        }
    }

    /// Every member's status, asked concurrently, in endpoint order.
    pub async fn statuses(&self) -> Vec<Result<MemberStatus, EtcdError>> {
        futures_util::future::join_all(self.settings.endpoints.iter().map(|e| self.status(e))).await
    }

    /// The statuses of the members that answered.
    pub async fn answering(&self) -> Vec<MemberStatus> {
        self.statuses()
            .await
            .into_iter()
            .filter_map(Result::ok)
            .collect()
    }

    /// `ask`'s answer from the first endpoint that gives one; `what` names it in errors.
    async fn first_answer<T, F, Fut>(&self, what: &str, ask: F) -> Result<T, EtcdError>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut last = EtcdError::NoLeader { members: 0 };
        for endpoint in &self.settings.endpoints {
            let client = match self.client(endpoint).await {
                Ok(c) => c,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            match tokio::time::timeout(self.settings.timeout, ask(client)).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) => last = member_error(endpoint, e),
                Err(_) => last = member_said(endpoint, format!("no {what} in time")),
            }
            self.forget(endpoint).await;
        }
        Err(last)
    }

    /// The members as the first answering endpoint lists them.
    pub async fn members(&self) -> Result<Vec<MemberInfo>, EtcdError> {
        let list = self
            .first_answer("member list", |mut c| async move { c.member_list().await })
            .await?;
        Ok(list
            .members()
            .iter()
            .map(|m| MemberInfo {
                id: m.id(),
                name: m.name().to_owned(),
                client_urls: m.client_urls().to_vec(),
            })
            .collect())
    }

    /// The alarms raised, as the first answering endpoint lists them.
    pub async fn alarms(&self) -> Result<Vec<EtcdAlarm>, EtcdError> {
        let answer = self
            .first_answer("alarm list", |mut c| async move {
                c.alarm(AlarmAction::Get, AlarmType::None, None).await
            })
            .await?;
        Ok(answer
            .alarms()
            .iter()
            .map(|a| EtcdAlarm {
                member: a.member_id(),
                alarm: a.alarm().as_str_name().to_owned(),
            })
            .collect())
    }

    /// The leader's own status, when a majority of the configured members agree on it.
    pub async fn leader(&self) -> Result<MemberStatus, EtcdError> {
        let statuses = self.answering().await;
        let n = self.settings.endpoints.len();
        let leader = majority_leader(&statuses, n).ok_or(EtcdError::NoLeader { members: n })?;
        statuses
            .into_iter()
            .find(|s| s.id == leader)
            .ok_or(EtcdError::NoLeader { members: n })
    }

    /// Moves leadership to member `to`: asks the leader itself (others refuse with "not
    /// leader"), then waits until a majority follows `to`.
    pub async fn move_leader(&self, to: u64, confirm_within: Duration) -> Result<(), EtcdError> {
        let leader = self.leader().await?;
        if leader.id != to {
            let mut client = self.client(&leader.endpoint).await?;
            tokio::time::timeout(self.settings.timeout, client.move_leader(to))
                .await
                .map_err(|_| member_said(&leader.endpoint, "move_leader got no answer in time"))?
                .map_err(|e| member_error(&leader.endpoint, e))?;
        }
        let started = Instant::now();
        loop {
            let statuses = self.answering().await;
            if majority_leader(&statuses, self.settings.endpoints.len()) == Some(to) {
                return Ok(());
            }
            if started.elapsed() > confirm_within {
                return Err(EtcdError::NotConfirmed {
                    to,
                    within: confirm_within,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The leader a strict majority of `members` follows, if any, from their statuses.
fn majority_leader(statuses: &[MemberStatus], members: usize) -> Option<u64> {
    agreed_leader(statuses.iter().map(|s| s.leader), members)
}

#[async_trait::async_trait]
impl EtcdMembers for Etcd {
    fn endpoints(&self) -> &[String] {
        Etcd::endpoints(self)
    }
    async fn members(&self) -> Result<Vec<MemberInfo>, EtcdError> {
        Etcd::members(self).await
    }
    async fn answering(&self) -> Vec<MemberStatus> {
        Etcd::answering(self).await
    }
    async fn move_leader(&self, to: u64, confirm_within: Duration) -> Result<(), EtcdError> {
        Etcd::move_leader(self, to, confirm_within).await
    }
    async fn alarms(&self) -> Result<Vec<EtcdAlarm>, EtcdError> {
        Etcd::alarms(self).await
    }
}

/// Opens clients of the etcd clusters `serve` rolls, with one TLS setting for all.
pub struct EtcdClients {
    /// TLS for `https://` members; `None`: plain members only.
    pub tls: Option<EtcdTls>,
    /// Bound on connecting and on every request.
    pub timeout: Duration,
}

impl EtcdConnect for EtcdClients {
    fn connect(&self, endpoints: &[String]) -> Result<Arc<dyn EtcdMembers>, EtcdError> {
        let https = endpoints.iter().any(|e| e.starts_with("https://"));
        if https && self.tls.is_none() {
            return Err(EtcdError::TlsMissing);
        }
        Ok(Arc::new(Etcd::new(EtcdSettings {
            endpoints: endpoints.to_vec(),
            timeout: self.timeout,
            tls: if https { self.tls.clone() } else { None },
        })?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(id: u64, leader: u64) -> MemberStatus {
        MemberStatus {
            endpoint: format!("e{id}"),
            id,
            leader,
            raft_term: 2,
            raft_index: 10,
            version: "3.4.23".into(),
        }
    }

    #[test]
    fn a_leader_needs_a_strict_majority() {
        assert_eq!(
            majority_leader(&[status(1, 1), status(2, 1), status(3, 1)], 3),
            Some(1)
        );
        assert_eq!(
            majority_leader(&[status(1, 1), status(2, 1)], 3),
            Some(1),
            "two of three"
        );
        assert_eq!(majority_leader(&[status(1, 1)], 3), None, "one of three");
        assert_eq!(
            majority_leader(&[status(1, 1), status(2, 2), status(3, 0)], 3),
            None,
            "split"
        );
        assert_eq!(
            majority_leader(&[status(1, 0), status(2, 0), status(3, 0)], 3),
            None,
            "no leader"
        );
        assert_eq!(
            majority_leader(&[status(1, 4), status(2, 4)], 4),
            None,
            "two of four is no majority"
        );
    }
}
