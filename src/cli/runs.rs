//! `rollgate runs …`: look at and control runs through the API.

use anyhow::{Context as _, bail};
use std::path::PathBuf;

use super::RunsAction;
use crate::config::Settings;

/// `rollgate runs …` against the API at `url` (default: `server.listen`).
pub(super) async fn runs(
    settings: &Settings,
    url: Option<String>,
    token_file: Option<PathBuf>,
    action: RunsAction,
) -> anyhow::Result<()> {
    let base = url.unwrap_or_else(|| format!("http://{}", settings.server.listen));
    let base = reqwest::Url::parse(&base).with_context(|| format!("--url {base:?}"))?;
    let token = crate::app::read_token(token_file.as_ref().unwrap_or(&settings.server.token_file))?;
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()?;
    let (method, target, body) = runs_request(&base, &action)?;
    let mut req = client.request(method, target).bearer_auth(token);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req
        .send()
        .await
        .with_context(|| format!("cannot reach rollgate at {base}"))?;
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
    match action {
        RunsAction::List { .. } => print_runs(&value),
        _ => println!("{}", serde_json::to_string_pretty(&value)?),
    }
    Ok(())
}

/// The method, URL and body of `action`: every id and value encoded into the URL.
fn runs_request(
    base: &reqwest::Url,
    action: &RunsAction,
) -> anyhow::Result<(reqwest::Method, reqwest::Url, Option<serde_json::Value>)> {
    let mut url = base.clone();
    let mut segments: Vec<&str> = vec!["v1", "runs"];
    let (method, body) = match action {
        RunsAction::List { status, limit } => {
            let mut query = url.query_pairs_mut();
            query.append_pair("limit", &limit.to_string());
            if let Some(status) = status {
                query.append_pair("status", status.0.name());
            }
            drop(query);
            (reqwest::Method::GET, None)
        }
        RunsAction::Show { id } => {
            segments.push(id);
            (reqwest::Method::GET, None)
        }
        RunsAction::Halt { id, reason }
        | RunsAction::Resume { id, reason }
        | RunsAction::Abort { id, reason } => {
            let verb = match action {
                RunsAction::Halt { .. } => "halt",
                RunsAction::Resume { .. } => "resume",
                _ => "abort",
            };
            segments.extend([id.as_str(), verb]);
            (
                reqwest::Method::POST,
                Some(serde_json::json!({ "reason": reason })),
            )
        }
    };
    url.path_segments_mut()
        .map_err(|()| anyhow::anyhow!("--url {base} cannot carry a path"))?
        .pop_if_empty()
        .extend(segments);
    Ok((method, url, body))
}

fn print_runs(value: &serde_json::Value) {
    println!(
        "{:<36}  {:<9}  {:<11}  {:<8}  {:<16}  REASON",
        "ID", "STATUS", "KIND", "TARGET", "STEP"
    );
    for run in value.as_array().into_iter().flatten() {
        let s = |k: &str| {
            run.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or("-")
                .to_owned()
        };
        let step = run
            .get("current_step")
            .and_then(|i| i.as_u64())
            .and_then(|i| run.get("steps")?.get(i as usize)?.get("name")?.as_str())
            .unwrap_or("-")
            .to_owned();
        println!(
            "{:<36}  {:<9}  {:<11}  {:<8}  {:<16}  {}",
            s("id"),
            s("status"),
            s("kind"),
            s("target"),
            step,
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
                },
                "GET",
                "http://127.0.0.1:8080/v1/runs?limit=5&status=halted",
            ),
            (
                RunsAction::Show {
                    id: "a/b?c=d#e".into(),
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
        let (_, u, _) = runs_request(&prefixed, &RunsAction::Show { id: "r".into() }).unwrap();
        assert_eq!(u.as_str(), "https://ops.example/rollgate/v1/runs/r");
    }
}
