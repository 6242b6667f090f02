//! Debian's headless Chromium, driven over the W3C WebDriver protocol by Debian's
//! chromedriver (packages chromium and chromium-driver, installed by scripts/test.sh).

use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

use super::free_port;
use super::services::Process;

/// The key W3C WebDriver gives an element reference under.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// One browser session.
pub struct Browser {
    base: String,
    http: reqwest::Client,
    _driver: Process,
    _dir: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session `width` pixels wide.
    pub async fn start(width: u32, height: u32) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let driver = Process::spawn(
            "chromedriver",
            "chromedriver",
            vec![format!("--port={port}")],
            dir.path().join("chromedriver.log"),
        );
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        let root = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        loop {
            let ready = http.get(format!("{root}/status")).send().await.ok();
            if let Some(r) = ready
                && r.status().is_success()
            {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not start: {}",
                driver.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = dir.path().join("profile");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", format!("--user-data-dir={}", profile.display()),
                    format!("--window-size={width},{height}")],
            },
        }}});
        let session: Value = http
            .post(format!("{root}/session"))
            .json(&caps)
            .send()
            .await
            .expect("a session")
            .json()
            .await
            .expect("JSON");
        let id = session["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {session}"))
            .to_owned();
        Self {
            base: format!("{root}/session/{id}"),
            http,
            _driver: driver,
            _dir: dir,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            req = req.json(&body);
        }
        req.send()
            .await
            .expect("chromedriver answers")
            .json::<Value>()
            .await
            .expect("JSON")
    }

    /// Opens `url`.
    pub async fn goto(&self, url: &str) {
        let answer = self
            .call(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
        assert!(answer["value"].is_null(), "{url}: {answer}");
    }

    /// The address shown now.
    pub async fn url(&self) -> String {
        let answer = self.call(reqwest::Method::GET, "/url", None).await;
        answer["value"].as_str().unwrap_or_default().to_owned()
    }

    /// The first element matching `css`, if any.
    async fn find(&self, css: &str) -> Option<String> {
        let answer = self
            .call(
                reqwest::Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        answer["value"][ELEMENT].as_str().map(str::to_owned)
    }

    /// The text of the first element matching `css`; `None` while there is none (or it
    /// was replaced while being read).
    pub async fn text(&self, css: &str) -> Option<String> {
        let id = self.find(css).await?;
        let answer = self
            .call(reqwest::Method::GET, &format!("/element/{id}/text"), None)
            .await;
        answer["value"].as_str().map(str::to_owned)
    }

    /// Waits up to `deadline` until the text of `css` meets `ok`; that text.
    pub async fn wait_text(
        &self,
        css: &str,
        what: &str,
        deadline: Duration,
        ok: impl Fn(&str) -> bool,
    ) -> String {
        let started = Instant::now();
        let mut last = None;
        loop {
            let text = self.text(css).await;
            if let Some(t) = &text
                && ok(t)
            {
                return t.clone();
            }
            last = text.or(last);
            assert!(
                started.elapsed() < deadline,
                "{what}: {css} still shows {last:?} after {deadline:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Clicks the first element matching `css`, once it is there and enabled.
    pub async fn click(&self, css: &str) {
        let started = Instant::now();
        loop {
            if let Some(id) = self.find(css).await {
                let enabled = self
                    .call(
                        reqwest::Method::GET,
                        &format!("/element/{id}/enabled"),
                        None,
                    )
                    .await;
                if enabled["value"] == true {
                    let answer = self
                        .call(
                            reqwest::Method::POST,
                            &format!("/element/{id}/click"),
                            Some(json!({})),
                        )
                        .await;
                    if answer["value"].is_null() {
                        return;
                    }
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "cannot click {css}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Types `text` into the first element matching `css`.
    pub async fn type_into(&self, css: &str, text: &str) {
        let id = self
            .find(css)
            .await
            .unwrap_or_else(|| panic!("no {css} to type into"));
        let answer = self
            .call(
                reqwest::Method::POST,
                &format!("/element/{id}/value"),
                Some(json!({"text": text})),
            )
            .await;
        assert!(answer["value"].is_null(), "{answer}");
    }

    /// Runs `script` in the page; what it returns.
    pub async fn script(&self, script: &str) -> Value {
        let answer = self
            .call(
                reqwest::Method::POST,
                "/execute/sync",
                Some(json!({"script": script, "args": []})),
            )
            .await;
        answer["value"].clone()
    }

    /// Resizes the window to `width` × `height` CSS pixels.
    pub async fn resize(&self, width: u32, height: u32) {
        let answer = self
            .call(
                reqwest::Method::POST,
                "/window/rect",
                Some(json!({"width": width, "height": height})),
            )
            .await;
        assert!(answer["value"]["width"].is_number(), "{answer}");
    }

    /// Writes a PNG of the page to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let answer = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let png = decode_base64(answer["value"].as_str().expect("a screenshot"));
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::create_dir_all(path.parent().expect("a directory")).expect("dir");
        std::fs::write(path, png).expect("screenshot written");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // End the session, which closes Chromium, with a client of its own: the test's
        // runtime, whose connections `self.http` pools, may be shutting down.
        let base = self.base.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async {
                    let client = reqwest::Client::builder()
                        .timeout(Duration::from_secs(10))
                        .build();
                    if let Ok(client) = client {
                        drop(client.delete(base).send().await);
                    }
                });
            }
        })
        .join()
        .ok();
        // Whatever is left of this browser (its profile directory is its own) goes too:
        // chromedriver, stopped next, does not take Chromium down with it.
        // The pattern without its leading dashes: pkill would read `--user-data-dir=…`
        // as an option of its own, refuse it, and leave the browser running.
        let profile = self._dir.path().join("profile");
        let _ = std::process::Command::new("pkill")
            .args([
                "-KILL",
                "-f",
                &format!("user-data-dir={}", profile.display()),
            ])
            .status();
    }
}

/// Standard base64, as WebDriver sends screenshots.
fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for sextet in text.bytes().filter_map(value) {
        acc = (acc << 6) | u32::from(sextet);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}
