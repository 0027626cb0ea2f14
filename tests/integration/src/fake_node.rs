//! A compromised node, driven by the test: a real node certificate of the fleet, a real
//! agent link to the controller and a real peer endpoint (HTTPS with that certificate) —
//! and nothing honest behind them. It takes every task and says at once that it holds
//! the image (under the digest the test gives it: another image's), names every other
//! node a suspect, and answers every blob request as the test chose: a redirect to a
//! loopback server, a trickle, an endless error body, wrong bytes, or a decompression
//! bomb.

use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use rigger_proto::v1::agent_link_client::AgentLinkClient;
use rigger_proto::v1::{
    AgentMessage, Heartbeat, Register, TaskPhase, TaskStatus, agent_message, controller_message,
    task,
};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;

/// How the fake node answers a blob request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 307 to a loopback server of the test's (which counts what reaches it).
    Redirect,
    /// 200, then a byte every 5 s.
    Trickle,
    /// 404 with a body that never ends.
    EndlessError,
    /// 200 and the blob's size in wrong bytes.
    WrongBytes,
    /// 200 and a gzip'd tar of one huge file of zeros, the blob's size of it.
    Bomb,
}

/// What the fake node says and does.
#[derive(Debug, Clone)]
pub struct Lies {
    /// The digest it reports for every pull (it resolved nothing).
    pub digest: String,
    /// Its peer endpoint's answers, one after the other per request (cycling).
    pub answers: Vec<Answer>,
    /// Blob sizes by digest (what the honest manifest says), for wrong bytes and bombs.
    pub sizes: HashMap<String, u64>,
    /// The nodes it names as suspects in every report (the honest ones).
    pub suspects: Vec<String>,
}

/// A running fake node; stops when dropped.
#[derive(Debug)]
pub struct FakeNode {
    pub name: String,
    pub peer_address: SocketAddr,
    /// Blob requests its peer endpoint got.
    pub requests: Arc<AtomicUsize>,
    /// Requests that reached the loopback server a redirect points at.
    pub redirect_hits: Arc<AtomicUsize>,
    /// Task statuses it sent.
    pub reports: Arc<AtomicU64>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl FakeNode {
    /// Start it as node `name` of `controller` (whose PKI issues its certificate),
    /// lying as `lies` says.
    pub fn start(controller: &crate::Controller, name: &str, lies: Lies) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("a runtime: {e}"));
        let (ca, cert, key) = controller.agent_certs(name);
        let requests = Arc::new(AtomicUsize::new(0));
        let redirect_hits = Arc::new(AtomicUsize::new(0));
        let reports = Arc::new(AtomicU64::new(0));
        let peer_listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap_or_else(|e| panic!("bind: {e}"));
        let peer_address = peer_listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let trap = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap_or_else(|e| panic!("bind: {e}"));
        let trap_address = trap.local_addr().unwrap_or_else(|e| panic!("{e}"));
        runtime.spawn(count_hits(trap, redirect_hits.clone()));
        let tls = server_tls(&cert, &key);
        // Bombs take a while to make: made before anyone asks (an answer that took its
        // time would be left for being slow, not stopped for inflating).
        let bombs: HashMap<u64, Arc<Vec<u8>>> = if lies.answers.contains(&Answer::Bomb) {
            lies.sizes
                .values()
                .map(|size| (*size, Arc::new(bomb(*size))))
                .collect()
        } else {
            HashMap::new()
        };
        runtime.spawn(serve_peers(
            peer_listener,
            tls,
            lies.clone(),
            Arc::new(bombs),
            trap_address,
            requests.clone(),
        ));
        runtime.spawn(link(
            controller.server.clone(),
            name.to_owned(),
            peer_address,
            (ca, cert, key),
            lies,
            reports.clone(),
        ));
        Self {
            name: name.to_owned(),
            peer_address,
            requests,
            redirect_hits,
            reports,
            runtime: Some(runtime),
        }
    }
}

fn server_tls(cert: &Path, key: &Path) -> Arc<rustls::ServerConfig> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .unwrap_or_else(|e| panic!("{}: {e}", cert.display()));
    let key =
        PrivateKeyDer::from_pem_file(key).unwrap_or_else(|e| panic!("{}: {e}", key.display()));
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map(|b| b.with_no_client_auth().with_single_cert(chain, key))
    .unwrap_or_else(|e| panic!("{e}"))
    .unwrap_or_else(|e| panic!("{e}"));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// The loopback server a redirect points at: it counts, and answers nothing.
async fn count_hits(listener: tokio::net::TcpListener, hits: Arc<AtomicUsize>) {
    while let Ok((_stream, _)) = listener.accept().await {
        hits.fetch_add(1, Ordering::SeqCst);
    }
}

async fn serve_peers(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    lies: Lies,
    bombs: Arc<HashMap<u64, Arc<Vec<u8>>>>,
    trap: SocketAddr,
    requests: Arc<AtomicUsize>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let lies = Arc::new(lies);
    while let Ok((stream, _)) = listener.accept().await {
        let (acceptor, lies, requests, bombs) = (
            acceptor.clone(),
            lies.clone(),
            requests.clone(),
            bombs.clone(),
        );
        tokio::spawn(async move {
            let Ok(mut tls) = acceptor.accept(stream).await else {
                return;
            };
            // One request per connection (then it closes).
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && head.len() < 16 << 10 {
                match tls.read(&mut byte).await {
                    Ok(1) => head.push(byte[0]),
                    _ => return,
                }
            }
            let head = String::from_utf8_lossy(&head).into_owned();
            let path = head
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_owned();
            let digest = path.rsplit('/').next().unwrap_or_default().to_owned();
            let n = requests.fetch_add(1, Ordering::SeqCst);
            let answer = lies.answers[n % lies.answers.len().max(1)];
            let size = lies.sizes.get(&digest).copied().unwrap_or(1 << 20);
            let bomb = bombs.get(&size).cloned();
            let _ = answer_with(&mut tls, answer, size, bomb, trap, &head).await;
        });
    }
}

async fn answer_with<W: tokio::io::AsyncWrite + Unpin>(
    out: &mut W,
    answer: Answer,
    size: u64,
    bomb: Option<Arc<Vec<u8>>>,
    trap: SocketAddr,
    head: &str,
) -> std::io::Result<()> {
    // A resumed request asks from an offset: the lie is the rest's size.
    let start: u64 = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("range: bytes=")
                .or(l.strip_prefix("Range: bytes="))
        })
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    let (status, range) = if start > 0 {
        (
            "206 Partial Content",
            format!(
                "Content-Range: bytes {start}-{}/{size}\r\n",
                size.saturating_sub(1)
            ),
        )
    } else {
        ("200 OK", String::new())
    };
    let length = size.saturating_sub(start);
    match answer {
        Answer::Redirect => {
            out.write_all(
                format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://{trap}/metadata\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                .as_bytes(),
            )
            .await
        }
        Answer::Trickle => {
            out.write_all(
                format!("HTTP/1.1 {status}\r\n{range}Content-Length: {length}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
            loop {
                out.write_all(b"x").await?;
                out.flush().await?;
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
        Answer::EndlessError => {
            out.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n",
            )
            .await?;
            let junk = vec![b'e'; 64 << 10];
            loop {
                out.write_all(&junk).await?;
            }
        }
        Answer::WrongBytes => {
            out.write_all(
                format!("HTTP/1.1 {status}\r\n{range}Content-Length: {length}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
            let wrong = vec![0x5au8; 64 << 10];
            let mut left = length;
            while left > 0 {
                let n = left.min(wrong.len() as u64) as usize;
                out.write_all(&wrong[..n]).await?;
                left -= n as u64;
            }
            out.flush().await
        }
        Answer::Bomb => {
            out.write_all(
                format!("HTTP/1.1 {status}\r\n{range}Content-Length: {length}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
            let bomb = bomb.unwrap_or_else(|| Arc::new(self::bomb(size)));
            let from = usize::try_from(start).unwrap_or(usize::MAX).min(bomb.len());
            out.write_all(&bomb[from..]).await?;
            out.flush().await
        }
    }
}

/// `size` bytes of a gzip'd tar holding one file of 64 GiB of zeros (cut off at `size`):
/// each byte inflates to about a thousand.
pub fn bomb(size: u64) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut header = tar::Header::new_gnu();
    header.set_path("zeros").unwrap_or_else(|e| panic!("{e}"));
    header.set_size(64 << 30);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_cksum();
    encoder
        .write_all(header.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    let zeros = vec![0u8; 1 << 20];
    while (encoder.get_ref().len() as u64) < size {
        encoder.write_all(&zeros).unwrap_or_else(|e| panic!("{e}"));
    }
    let mut bytes = encoder.finish().unwrap_or_else(|e| panic!("{e}"));
    bytes.truncate(usize::try_from(size).unwrap_or(usize::MAX));
    bytes.resize(usize::try_from(size).unwrap_or(usize::MAX), 0);
    bytes
}

/// The agent link, as a compromised agent keeps it.
async fn link(
    server: String,
    name: String,
    peer_address: SocketAddr,
    (ca, cert, key): (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf),
    lies: Lies,
    reports: Arc<AtomicU64>,
) {
    let read = |path: &Path| std::fs::read(path).unwrap_or_else(|e| panic!("{e}"));
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(read(&ca)))
        .identity(tonic::transport::Identity::from_pem(
            read(&cert),
            read(&key),
        ));
    loop {
        let endpoint = tonic::transport::Endpoint::from_shared(server.clone())
            .unwrap_or_else(|e| panic!("{e}"))
            .tls_config(tls.clone())
            .unwrap_or_else(|e| panic!("{e}"));
        if let Ok(channel) = endpoint.connect().await {
            let _ = session(channel, &name, peer_address, &lies, &reports).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn session(
    channel: tonic::transport::Channel,
    name: &str,
    peer_address: SocketAddr,
    lies: &Lies,
    reports: &AtomicU64,
) -> Result<(), tonic::Status> {
    let (tx, rx) = mpsc::channel::<AgentMessage>(64);
    let send = |message| AgentMessage {
        message: Some(message),
    };
    let _ = tx
        .send(send(agent_message::Message::Register(Register {
            node_name: name.to_owned(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            peer_address: peer_address.to_string(),
            ..Register::default()
        })))
        .await;
    let mut inbound = AgentLinkClient::new(channel)
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let beat = tx.clone();
    let heartbeats = tokio::spawn(async move {
        let mut sequence = 0;
        loop {
            sequence += 1;
            if beat
                .send(send(agent_message::Message::Heartbeat(Heartbeat {
                    sequence,
                    ..Heartbeat::default()
                })))
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    while let Some(message) = inbound.message().await? {
        let Some(controller_message::Message::Task(task)) = message.message else {
            continue;
        };
        if !matches!(task.work, Some(task::Work::PullImage(_))) {
            continue;
        }
        // Every other node is a suspect; the image is held at once, under the lie.
        for phase in [TaskPhase::Running, TaskPhase::Succeeded] {
            reports.fetch_add(1, Ordering::SeqCst);
            let _ = tx
                .send(send(agent_message::Message::TaskStatus(TaskStatus {
                    id: task.id.clone(),
                    phase: phase.into(),
                    image_digest: lies.digest.clone(),
                    bytes_done: 1,
                    bytes_total: 1,
                    suspected_peers: lies.suspects.clone(),
                    message: String::new(),
                    ..TaskStatus::default()
                })))
                .await;
        }
    }
    heartbeats.abort();
    Ok(())
}
