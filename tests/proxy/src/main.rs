//! `rigger-lab-proxy`: an HTTP proxy in front of the lab registry, for tests and
//! benchmarks. It models a distant registry (a delay on every new connection, a
//! bandwidth cap per TCP connection) and injects the faults real registries produce:
//! error statuses (with `Retry-After`), connections reset mid-body, truncated or corrupt
//! bodies, and bodies that stall without closing.
//!
//! It prints `listening on ADDR` on its first stdout line. Faults are rules, from
//! `--faults FILE` or `PUT /_proxy/faults` (JSON list); `GET /_proxy/requests` lists what
//! it served. Rules apply in order to requests whose path contains `path_contains`,
//! each at most `times` times:
//!
//! ```json
//! [{"path_contains": "/blobs/", "action": {"status": 429, "retry_after": 1}, "times": 2},
//!  {"path_contains": "/blobs/", "action": {"reset_after": 100000}, "times": 1},
//!  {"path_contains": "/blobs/", "action": {"truncate_after": 100000}, "times": 1},
//!  {"path_contains": "/blobs/", "action": {"corrupt": true}, "times": 1},
//!  {"path_contains": "/blobs/", "action": {"stall_after": 0}, "times": 1},
//!  {"path_contains": "/manifests/", "action": {"endless": true}, "times": 1},
//!  {"path_contains": "/blobs/", "action": {"redirect": "http://127.0.0.1:5001"}, "times": 9},
//!  {"path_contains": "app-", "action": {"hold_until_repositories": 2, "among": "app-",
//!   "at_most_ms": 30000}, "times": 99}]
//! ```
//!
//! `hold_until_repositories` holds the request until requests for that many repositories
//! whose path contains `among` have arrived (this one's included), or `at_most_ms` passed:
//! a test can make sure several pulls are in flight together, whenever each began.
//!
//! `endless` answers 200 with the manifest content type and a body that never ends (a
//! manifest bomb), without asking the registry. `redirect` answers 307 to the same path
//! on another origin (blobs served from object storage).
//!
//! Each request is recorded with its headers; `Authorization` only by its scheme
//! (`Basic`, `Bearer`), so tests can tell whether credentials arrived without the proxy
//! keeping them. `--require-header NAME=VALUE` refuses (403) requests without that
//! header; `--api-root /PATH` serves the registry's `/v2` under `/PATH` instead (a host
//! that needs containerd's `override_path`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};

#[derive(Debug, Parser)]
#[command(
    name = "rigger-lab-proxy",
    about = "Registry proxy with latency, bandwidth caps and faults"
)]
struct Args {
    /// Address to listen on (port 0 picks one; see the first stdout line).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The registry behind the proxy, e.g. http://127.0.0.1:5000
    #[arg(long)]
    upstream: String,
    /// Delay before serving each new TCP connection, e.g. 40ms.
    #[arg(long, value_parser = humantime::parse_duration)]
    connection_latency: Option<Duration>,
    /// Bytes per second per TCP connection for response bodies, e.g. 16MiB.
    #[arg(long)]
    connection_rate: Option<bytesize::ByteSize>,
    /// Bytes per second for all response bodies together, e.g. 24MiB: a registry's
    /// egress, shared by every connection (on top of --connection-rate).
    #[arg(long)]
    total_rate: Option<bytesize::ByteSize>,
    /// JSON file with fault rules.
    #[arg(long)]
    faults: Option<std::path::PathBuf>,
    /// Refuse (403) requests without this header: `NAME=VALUE`.
    #[arg(long, value_parser = parse_header)]
    require_header: Option<(String, String)>,
    /// Serve the registry's `/v2` under this path instead, e.g. `/registry/api`.
    #[arg(long)]
    api_root: Option<String>,
    /// Drop `Range` headers: answer every request with the whole body, as servers
    /// without range support do.
    #[arg(long)]
    ignore_range: bool,
}

fn parse_header(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned()))
        .ok_or_else(|| format!("{text:?} is not NAME=VALUE"))
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
enum Action {
    /// Answer with this status (and `Retry-After` seconds, when given).
    Status {
        status: u16,
        retry_after: Option<u64>,
    },
    /// Send this many body bytes, then reset the connection.
    ResetAfter { reset_after: u64 },
    /// Send this many body bytes, then stop sending without closing.
    StallAfter { stall_after: u64 },
    /// Send this many body bytes, then end the body early (short of its
    /// Content-Length): a truncated response.
    TruncateAfter { truncate_after: u64 },
    /// Flip bits in the first body byte (a wrong digest): `{"corrupt": true}`.
    Corrupt { corrupt: bool },
    /// Answer 200 with a body that never ends: `{"endless": true}`.
    Endless { endless: bool },
    /// Answer 307 to the same path on this origin: `{"redirect": "http://host:port"}`.
    Redirect { redirect: String },
    /// Hold the request until requests for this many repositories (paths containing
    /// `among`) arrived, or `at_most_ms` passed; then serve it.
    HoldUntilRepositories {
        hold_until_repositories: usize,
        among: String,
        at_most_ms: u64,
    },
}

#[derive(Debug, Clone, Deserialize, Serialize)]
struct Rule {
    path_contains: String,
    action: Action,
    times: u32,
}

#[derive(Debug, Clone, Serialize)]
struct Served {
    method: String,
    path: String,
    range: Option<String>,
    status: u16,
    fault: Option<String>,
    /// Body bytes handed to the client's connection so far.
    sent: u64,
    /// When the request arrived, in microseconds since the Unix epoch.
    arrived_us: u64,
    /// When the last body byte so far was handed to the client's connection (µs since
    /// the epoch; the request's arrival until one was): a request was in flight from
    /// `arrived_us` to this, whoever else's overlapped.
    last_sent_us: u64,
    /// The client's TCP connection, numbered in the order they were accepted (from 1).
    connection: u64,
    /// The scheme of the `Authorization` header, when one came.
    authorization: Option<String>,
    /// The other request headers (names lowercase).
    headers: std::collections::BTreeMap<String, String>,
}

struct State {
    upstream: String,
    client: reqwest::Client,
    rules: Mutex<Vec<Rule>>,
    served: Mutex<Vec<Served>>,
    /// Every request's path as it arrived (held ones too, unlike `served`).
    arrived: Mutex<Vec<String>>,
    latency: Option<Duration>,
    rate: Option<u64>,
    /// The egress shared by every connection, when capped.
    total: Option<Arc<tokio::sync::Mutex<Bucket>>>,
    require_header: Option<(String, String)>,
    ignore_range: bool,
    api_root: Option<String>,
}

type Body = BoxBody<Bytes, std::io::Error>;

fn full(status: StatusCode, text: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(
        Full::new(text.into())
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // reqwest is built without a default TLS provider in this workspace (see Cargo.toml).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rules: Vec<Rule> = match &args.faults {
        Some(path) => serde_json::from_slice(
            &std::fs::read(path).with_context(|| format!("{}", path.display()))?,
        )
        .with_context(|| format!("fault rules in {}", path.display()))?,
        None => Vec::new(),
    };
    let state = Arc::new(State {
        upstream: args.upstream.trim_end_matches('/').to_owned(),
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .context("HTTP client")?,
        rules: Mutex::new(rules),
        served: Mutex::default(),
        arrived: Mutex::default(),
        latency: args.connection_latency,
        rate: args.connection_rate.map(|r| r.as_u64()),
        total: args
            .total_rate
            .map(|r| Arc::new(tokio::sync::Mutex::new(Bucket::new(Some(r.as_u64()))))),
        require_header: args.require_header,
        ignore_range: args.ignore_range,
        api_root: args.api_root.map(|r| r.trim_end_matches('/').to_owned()),
    });
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    println!("listening on {}", listener.local_addr()?);
    let mut accepted = 0u64;
    loop {
        let (stream, _) = listener.accept().await?;
        accepted += 1;
        let connection = accepted;
        let state = state.clone();
        tokio::spawn(async move {
            if let Some(latency) = state.latency {
                tokio::time::sleep(latency).await;
            }
            // One bandwidth budget per TCP connection, shared by its requests.
            let bucket = Arc::new(tokio::sync::Mutex::new(Bucket::new(state.rate)));
            let service = service_fn(move |request| {
                handle(state.clone(), bucket.clone(), connection, request)
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    state: Arc<State>,
    bucket: Arc<tokio::sync::Mutex<Bucket>>,
    connection: u64,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    match (request.method().as_str(), path.as_str()) {
        ("GET", "/_proxy/requests") => {
            let served = state.served.lock().map(|s| s.clone()).unwrap_or_default();
            return Ok(full(
                StatusCode::OK,
                serde_json::to_vec(&served).unwrap_or_default(),
            ));
        }
        ("PUT", "/_proxy/faults") => {
            let body = request
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return Ok(match serde_json::from_slice::<Vec<Rule>>(&body) {
                Ok(rules) => {
                    if let Ok(mut current) = state.rules.lock() {
                        *current = rules;
                    }
                    full(StatusCode::OK, "ok\n")
                }
                Err(e) => full(StatusCode::BAD_REQUEST, format!("{e}\n")),
            });
        }
        _ => {}
    }
    let range = request
        .headers()
        .get(hyper::header::RANGE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let authorization = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split_whitespace().next().unwrap_or_default().to_owned());
    let headers: std::collections::BTreeMap<String, String> = request
        .headers()
        .iter()
        .filter(|(name, _)| *name != hyper::header::AUTHORIZATION)
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    let fault = take_rule(&state, &path);
    let arrived_us = unix_micros();
    if let Ok(mut arrived) = state.arrived.lock() {
        arrived.push(path.clone());
    }
    if let Some(Action::HoldUntilRepositories {
        hold_until_repositories,
        among,
        at_most_ms,
    }) = &fault
    {
        let deadline = Instant::now() + Duration::from_millis(*at_most_ms);
        while repositories_arrived(&state, among) < *hold_until_repositories
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let record = |status: u16, fault: Option<&Action>| {
        let mut served = state.served.lock().ok()?;
        served.push(Served {
            method: request.method().to_string(),
            path: path.clone(),
            range: range.clone(),
            status,
            fault: fault.map(|f| format!("{f:?}")),
            sent: 0,
            arrived_us,
            last_sent_us: arrived_us,
            connection,
            authorization: authorization.clone(),
            headers: headers.clone(),
        });
        Some(served.len() - 1)
    };
    if let Some((name, value)) = &state.require_header
        && headers.get(name) != Some(value)
    {
        record(403, None);
        return Ok(full(StatusCode::FORBIDDEN, format!("{name} required\n")));
    }
    // Under `--api-root`, only that path is the API; it is `/v2` upstream.
    let upstream_path = match &state.api_root {
        None => path.clone(),
        Some(root) => match path.strip_prefix(root.as_str()) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("/v2{rest}"),
            _ => {
                record(404, None);
                return Ok(full(StatusCode::NOT_FOUND, "not under the API root\n"));
            }
        },
    };
    if let Some(Action::Redirect { redirect }) = &fault {
        record(307, fault.as_ref());
        let mut response = full(StatusCode::TEMPORARY_REDIRECT, "redirected\n");
        if let Ok(location) = format!("{}{path}", redirect.trim_end_matches('/')).parse() {
            response
                .headers_mut()
                .insert(hyper::header::LOCATION, location);
        }
        return Ok(response);
    }
    if let Some(Action::Status {
        status,
        retry_after,
    }) = &fault
    {
        record(*status, fault.as_ref());
        let mut response = full(
            StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "injected\n",
        );
        if let Some(seconds) = retry_after
            && let Ok(value) = seconds.to_string().parse()
        {
            response
                .headers_mut()
                .insert(hyper::header::RETRY_AFTER, value);
        }
        return Ok(response);
    }

    if let Some(Action::Endless { endless: true }) = &fault {
        let index = record(200, fault.as_ref());
        let counter = state.clone();
        // JSON whitespace after an opening brace, 64 KiB a piece, forever.
        let piece = Bytes::from({
            let mut piece = vec![b' '; 64 << 10];
            piece[0] = b'{';
            piece
        });
        let endless = futures::stream::repeat(piece).map(move |piece| {
            if let (Some(i), Ok(mut served)) = (index, counter.served.lock())
                && let Some(record) = served.get_mut(i)
            {
                record.sent += piece.len() as u64;
            }
            Ok::<_, std::io::Error>(Frame::data(piece))
        });
        return Ok(Response::builder()
            .status(StatusCode::OK)
            .header(
                hyper::header::CONTENT_TYPE,
                "application/vnd.oci.image.manifest.v1+json",
            )
            .body(BodyExt::boxed(StreamBody::new(endless)))
            .unwrap_or_else(|_| full(StatusCode::INTERNAL_SERVER_ERROR, "endless\n")));
    }

    let mut upstream = state.client.request(
        request.method().clone(),
        format!("{}{upstream_path}", state.upstream),
    );
    for (name, value) in request.headers() {
        if name != hyper::header::HOST && !(state.ignore_range && name == hyper::header::RANGE) {
            upstream = upstream.header(name, value);
        }
    }
    let response = match upstream.send().await {
        Ok(r) => r,
        Err(e) => {
            record(502, None);
            return Ok(full(StatusCode::BAD_GATEWAY, format!("upstream: {e}\n")));
        }
    };
    let status = response.status().as_u16();
    let index = record(status, fault.as_ref());
    let mut builder = Response::builder().status(status);
    for (name, value) in response.headers() {
        builder = builder.header(name, value);
    }
    let counter = state.clone();
    let count_sent = move |n: u64| {
        if let (Some(i), Ok(mut served)) = (index, counter.served.lock())
            && let Some(record) = served.get_mut(i)
        {
            record.sent += n;
            record.last_sent_us = unix_micros();
        }
    };
    let buckets: Vec<_> = std::iter::once(bucket).chain(state.total.clone()).collect();
    let body = faulty_body(response.bytes_stream(), fault.as_ref(), buckets, count_sent);
    Ok(builder
        .body(BodyExt::boxed(StreamBody::new(
            body.map(|r| r.map(Frame::data)),
        )))
        .unwrap_or_else(|_| full(StatusCode::BAD_GATEWAY, "bad upstream response\n")))
}

/// What happens after the bytes a fault lets through.
enum After {
    Continue,
    Reset,
    Stall,
    Ended,
}

/// The upstream body, throttled by `buckets` (the connection's, and the egress shared by
/// all when capped), with `fault` applied.
fn faulty_body(
    upstream: impl futures::Stream<Item = reqwest::Result<Bytes>> + Send + Unpin + 'static,
    fault: Option<&Action>,
    buckets: Vec<Arc<tokio::sync::Mutex<Bucket>>>,
    count_sent: impl Fn(u64) + Clone + Send + 'static,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let limit = match fault {
        Some(Action::ResetAfter { reset_after }) => Some((*reset_after, After::Reset)),
        Some(Action::StallAfter { stall_after }) => Some((*stall_after, After::Stall)),
        Some(Action::TruncateAfter { truncate_after }) => Some((*truncate_after, After::Ended)),
        _ => None,
    };
    let corrupt = matches!(fault, Some(Action::Corrupt { corrupt: true }));
    let state = (upstream, 0u64, corrupt, limit, After::Continue);
    futures::stream::unfold(state, move |(mut upstream, sent, corrupt, limit, after)| {
        let buckets = buckets.clone();
        let count_sent = count_sent.clone();
        async move {
            match after {
                After::Ended => return None,
                After::Reset => {
                    let reset =
                        std::io::Error::new(std::io::ErrorKind::ConnectionReset, "injected reset");
                    return Some((Err(reset), (upstream, sent, corrupt, limit, After::Ended)));
                }
                After::Stall => {
                    futures::future::pending::<()>().await;
                    return None;
                }
                After::Continue => {}
            }
            let mut piece = match upstream.next().await? {
                Ok(piece) => piece,
                Err(e) => {
                    return Some((
                        Err(std::io::Error::other(e)),
                        (upstream, sent, corrupt, limit, After::Ended),
                    ));
                }
            };
            if corrupt && sent == 0 && !piece.is_empty() {
                let mut bytes = piece.to_vec();
                bytes[0] ^= 0xff;
                piece = Bytes::from(bytes);
            }
            let mut next = After::Continue;
            if let Some((at, what)) = &limit
                && sent + piece.len() as u64 >= *at
            {
                piece = piece.slice(..usize::try_from(at - sent).unwrap_or(0).min(piece.len()));
                next = match what {
                    After::Stall => After::Stall,
                    After::Ended => After::Ended,
                    _ => After::Reset,
                };
            }
            for bucket in &buckets {
                bucket.lock().await.take(piece.len() as u64).await;
            }
            count_sent(piece.len() as u64);
            let sent = sent + piece.len() as u64;
            Some((Ok(piece), (upstream, sent, corrupt, limit, next)))
        }
    })
}

fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// How many repositories requests whose path contains `among` were for: the part of
/// `/v2/REPOSITORY/manifests/...` or `/v2/REPOSITORY/blobs/...` before the last of those.
fn repositories_arrived(state: &State, among: &str) -> usize {
    let Ok(arrived) = state.arrived.lock() else {
        return 0;
    };
    arrived
        .iter()
        .filter(|path| path.contains(among))
        .filter_map(|path| {
            let (repository, _) = path
                .rsplit_once("/manifests/")
                .or_else(|| path.rsplit_once("/blobs/"))?;
            Some(repository)
        })
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

/// Find (and count down) the first rule matching `path`.
fn take_rule(state: &State, path: &str) -> Option<Action> {
    let mut rules = state.rules.lock().ok()?;
    let rule = rules
        .iter_mut()
        .find(|r| r.times > 0 && path.contains(&r.path_contains))?;
    rule.times -= 1;
    Some(rule.action.clone())
}

/// A per-connection token bucket. It starts empty and holds at most 50 ms of bytes, so a
/// fresh connection gets no free burst (a distant registry's TCP slow start gives none).
struct Bucket {
    rate: Option<u64>,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(rate: Option<u64>) -> Self {
        Self {
            rate,
            tokens: 0.0,
            last: Instant::now(),
        }
    }

    async fn take(&mut self, n: u64) {
        let Some(rate) = self.rate else { return };
        let rate = rate as f64;
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.last).as_secs_f64() * rate).min(rate / 20.0);
        self.last = now;
        self.tokens -= n as f64;
        if self.tokens < 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(-self.tokens / rate)).await;
        }
    }
}
