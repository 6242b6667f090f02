//! `rollgate runs …`: look at and control runs through the API.

use anyhow::{Context as _, bail};
use std::process::ExitCode;

use std::time::Duration;

use super::{ApiArgs, ApiTlsArgs, RunsAction, api_url};
use crate::adapters::http_client::HttpSource;
use crate::config::Settings;

/// How the CLI reaches rollgate's API: its base URL (default `server.listen`), the token
/// (default `server.token_file`) and the client's TLS settings.
pub(super) struct Api {
    pub base: reqwest::Url,
    pub token: String,
    pub source_tls: ApiTlsArgs,
    /// With --tls-server-name: the name `base` carries, and the address it is reached at.
    resolve: Option<(String, std::net::SocketAddr)>,
}

impl Api {
    pub(super) fn new(settings: &Settings, args: ApiArgs) -> anyhow::Result<Self> {
        let ApiArgs {
            url,
            token_file,
            tls,
        } = args;
        let base = url.unwrap_or_else(|| {
            format!("{}://{}", settings.server.scheme(), settings.server.listen)
        });
        let mut base = reqwest::Url::parse(&base).with_context(|| format!("--url {base:?}"))?;
        let resolve = match &tls.tls_server_name {
            None => None,
            Some(name) => {
                let addr = base
                    .socket_addrs(|| None)
                    .with_context(|| format!("--url {base}: no address"))?
                    .into_iter()
                    .next()
                    .with_context(|| format!("--url {base}: no address"))?;
                base.set_host(Some(name))
                    .with_context(|| format!("--tls-server-name {name:?} is not a host name"))?;
                Some((name.clone(), addr))
            }
        };
        let token =
            crate::app::read_token(token_file.as_ref().unwrap_or(&settings.server.token_file))?;
        Ok(Self {
            base,
            token,
            source_tls: tls,
            resolve,
        })
    }

    /// A client builder that reaches `base`'s address, and with --tls-server-name checks
    /// the certificate against that name.
    pub(super) fn builder(&self) -> anyhow::Result<reqwest::ClientBuilder> {
        let builder = self.source().builder()?;
        Ok(match &self.resolve {
            Some((name, addr)) => builder.resolve(name, *addr),
            None => builder,
        })
    }

    /// The client for one request at a time, each bounded.
    pub(super) fn client(&self) -> anyhow::Result<reqwest::Client> {
        Ok(self.builder()?.timeout(Duration::from_secs(10)).build()?)
    }

    fn source(&self) -> HttpSource<'_> {
        HttpSource {
            section: "--",
            timeout: Duration::from_secs(10),
            bearer_token_file: None,
            basic_auth_user: None,
            basic_auth_password_file: None,
            ca_file: self.source_tls.ca_file.as_ref(),
            identity: self
                .source_tls
                .cert_file
                .as_ref()
                .zip(self.source_tls.key_file.as_ref()),
        }
    }

    /// GETs `segments` under the base URL; the JSON answer, or the API's message.
    pub(super) async fn get(&self, segments: &[&str]) -> anyhow::Result<serde_json::Value> {
        let client = self.client()?;
        let url = api_url(&self.base, segments)?;
        let resp = client
            .get(url)
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("cannot reach rollgate at {}", self.base))?;
        answer(resp).await
    }
}

/// The JSON of a successful answer, or an error with the API's message.
async fn answer(resp: reqwest::Response) -> anyhow::Result<serde_json::Value> {
    let status = resp.status();
    let value: serde_json::Value = resp.json().await.context("the answer is not JSON")?;
    if !status.is_success() {
        bail!(
            "{status}: {}",
            value
                .get("message")
                .and_then(|m| m.as_str())
                .unwrap_or("no message")
        );
    }
    Ok(value)
}

/// `rollgate runs …` against the API at `url` (default: `server.listen`).
pub(super) async fn runs(
    settings: &Settings,
    args: ApiArgs,
    action: RunsAction,
) -> anyhow::Result<ExitCode> {
    let api = Api::new(settings, args)?;
    let (base, token) = (&api.base, &api.token);
    if let RunsAction::Watch { id, until_held } = &action {
        // The event stream stays open: only connecting is bounded.
        let client = api.builder()?.build()?;
        let until = if *until_held {
            super::watch::Until::Held
        } else {
            super::watch::Until::Ended
        };
        return super::watch::watch(&client, base, token, id, until).await;
    }
    let client = api.client()?;
    let (method, target, body) = runs_request(base, &action)?;
    let mut req = client.request(method, target).bearer_auth(token);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req
        .send()
        .await
        .with_context(|| format!("cannot reach rollgate at {base}"))?;
    let value = answer(resp).await?;
    match action {
        RunsAction::List { json: false, .. } => print_runs(&value),
        RunsAction::Show { json: false, .. } => print!("{}", super::show::run_in_words(&value)),
        _ => println!("{}", serde_json::to_string_pretty(&value)?),
    }
    Ok(ExitCode::SUCCESS)
}

/// The method, URL and body of `action`: every id and value encoded into the URL.
fn runs_request(
    base: &reqwest::Url,
    action: &RunsAction,
) -> anyhow::Result<(reqwest::Method, reqwest::Url, Option<serde_json::Value>)> {
    let mut url = base.clone();
    let mut segments: Vec<&str> = vec!["v1", "runs"];
    let (method, body) = match action {
        RunsAction::List {
            status,
            limit,
            json,
        } => {
            let mut query = url.query_pairs_mut();
            query.append_pair("limit", &limit.to_string());
            if !json {
                query.append_pair("view", "summary");
            }
            if let Some(status) = status {
                query.append_pair("status", status.0.name());
            }
            drop(query);
            (reqwest::Method::GET, None)
        }
        RunsAction::Show { id, .. } | RunsAction::Watch { id, .. } => {
            segments.push(id);
            (reqwest::Method::GET, None)
        }
        RunsAction::Halt { id, reason }
        | RunsAction::Resume { id, reason }
        | RunsAction::Abort { id, reason }
        | RunsAction::Approve { id, reason } => {
            let verb = match action {
                RunsAction::Halt { .. } => "halt",
                RunsAction::Resume { .. } => "resume",
                RunsAction::Approve { .. } => "approve",
                _ => "abort",
            };
            segments.extend([id.as_str(), verb]);
            (
                reqwest::Method::POST,
                Some(serde_json::json!({ "reason": reason })),
            )
        }
    };
    let url = api_url(&url, &segments)?;
    Ok((method, url, body))
}

fn print_runs(value: &serde_json::Value) {
    println!(
        "{:<36}  {:<9}  {:<11}  {:<8}  {:>8}  {:<24}  REASON",
        "ID", "STATUS", "KIND", "TARGET", "PROGRESS", "STEP"
    );
    for run in value.as_array().into_iter().flatten() {
        let s = |k: &str| run[k].as_str().unwrap_or("-").to_owned();
        let n = |k: &str| run[k].as_u64().unwrap_or(0);
        println!(
            "{:<36}  {:<9}  {:<11}  {:<8}  {:>8}  {:<24}  {}",
            s("id"),
            s("status"),
            s("kind"),
            s("target"),
            format!("{}/{}", n("steps_done"), n("steps_total")),
            s("step"),
            s("reason")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::StatusArg;

    #[test]
    fn runs_requests_encode_ids_and_values_into_the_url() {
        let base = reqwest::Url::parse("http://127.0.0.1:8080/").unwrap();
        let cases = [
            (
                RunsAction::List {
                    status: Some(StatusArg(crate::domain::run::RunStatus::Halted)),
                    limit: 5,
                    json: false,
                },
                "GET",
                "http://127.0.0.1:8080/v1/runs?limit=5&view=summary&status=halted",
            ),
            (
                RunsAction::Show {
                    id: "a/b?c=d#e".into(),
                    json: false,
                },
                "GET",
                "http://127.0.0.1:8080/v1/runs/a%2Fb%3Fc=d%23e",
            ),
            (
                RunsAction::Abort {
                    id: "r 1".into(),
                    reason: "x".into(),
                },
                "POST",
                "http://127.0.0.1:8080/v1/runs/r%201/abort",
            ),
        ];
        for (action, method, url) in cases {
            let (m, u, _) = runs_request(&base, &action).unwrap();
            assert_eq!((m.as_str(), u.as_str()), (method, url));
        }
        let prefixed = reqwest::Url::parse("https://ops.example/rollgate").unwrap();
        let (_, u, _) = runs_request(
            &prefixed,
            &RunsAction::Show {
                id: "r".into(),
                json: true,
            },
        )
        .unwrap();
        assert_eq!(u.as_str(), "https://ops.example/rollgate/v1/runs/r");
    }
}
