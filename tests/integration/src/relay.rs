//! A TCP relay whose link a test can cut, like a network partition.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

/// A TCP relay in front of a server, whose link can be cut like a network partition:
/// while cut, nothing is forwarded either way and connections stay open (no reset, no
/// close: packets that go nowhere); restored, the bytes held back flow again.
#[derive(Debug)]
pub struct TcpRelay {
    /// `127.0.0.1:PORT`
    pub address: String,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl TcpRelay {
    /// Relay to `upstream` (`host:port`).
    pub fn start(upstream: &str) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let (upstream, flag) = (upstream.to_owned(), cut.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                for (from, to) in [
                    (client.try_clone(), server.try_clone()),
                    (server.try_clone(), client.try_clone()),
                ] {
                    if let (Ok(from), Ok(to)) = (from, to) {
                        let flag = flag.clone();
                        std::thread::spawn(move || relay_bytes(from, to, &flag));
                    }
                }
            }
        });
        Self { address, cut }
    }

    /// Stop forwarding (connections stay open).
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Forward again.
    pub fn restore(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

fn relay_bytes(mut from: TcpStream, mut to: TcpStream, cut: &std::sync::atomic::AtomicBool) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        while cut.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Read just before a cut: hold it back until the link is restored.
        while cut.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}
