//! `rigger-lab-sidecar --port PORT [--version TEXT]`: the lab's test sidecar for
//! SidecarSet hot upgrades (built statically, so it runs in a busybox image).
//!
//! It answers every HTTP request with `200` and its version. It listens with
//! SO_REUSEPORT, so a successor started beside it listens on the same port at once; on
//! SIGTERM it closes its listener — with `net.ipv4.tcp_migrate_req=1` (the lab sets it;
//! Linux ≥ 5.14) the connections still queued on it move to the successor instead of
//! being reset — finishes the requests in flight and exits 0. `/tmp/listening` appears
//! once it serves (a postStart hook waits for it: that is the state migration).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsFd as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::socket::{
    AddressFamily, Backlog, SockFlag, SockType, SockaddrIn, bind, listen, setsockopt, socket,
    sockopt,
};

fn args() -> Result<(u16, String), String> {
    let (mut port, mut version) = (None, String::from("1"));
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--port" => port = Some(value.parse().map_err(|e| format!("--port: {e}"))?),
            "--version" => version = value,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok((port.ok_or("--port is required")?, version))
}

/// A listener on `port` that shares the port with its predecessor and successor.
fn listen_shared(port: u16) -> nix::Result<TcpListener> {
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    setsockopt(&fd, sockopt::ReusePort, &true)?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::from(SocketAddrV4::new([0, 0, 0, 0].into(), port)),
    )?;
    listen(&fd, Backlog::new(1024)?)?;
    Ok(TcpListener::from(fd))
}

fn serve(mut stream: TcpStream, version: &str) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut request = Vec::new();
    let mut buffer = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buffer[..n]),
        }
    }
    let body = format!("{version}\n");
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn main() {
    let (port, version) = match args() {
        Ok(parsed) => parsed,
        Err(reason) => {
            eprintln!("rigger-lab-sidecar: {reason}");
            std::process::exit(64);
        }
    };
    // SIGTERM is waited for by a thread: blocked everywhere first.
    let mut term = SigSet::empty();
    term.add(Signal::SIGTERM);
    if term.thread_block().is_err() {
        std::process::exit(70);
    }
    let listener = match listen_shared(port) {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("rigger-lab-sidecar: port {port}: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = listener.set_nonblocking(true) {
        eprintln!("rigger-lab-sidecar: {e}");
        std::process::exit(1);
    }
    let _ = std::fs::write("/tmp/listening", &version);
    eprintln!("rigger-lab-sidecar {version}: serving on port {port}");

    let draining = Arc::new(AtomicBool::new(false));
    {
        let draining = draining.clone();
        std::thread::spawn(move || {
            if term.wait().is_ok() {
                draining.store(true, Ordering::SeqCst);
            }
        });
    }
    let in_flight = Arc::new(AtomicUsize::new(0));
    let version: Arc<str> = Arc::from(version.as_str());
    while !draining.load(Ordering::SeqCst) {
        // Poll, so a drain is noticed within 20 ms.
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        if !matches!(poll(&mut fds, PollTimeout::from(20u8)), Ok(n) if n > 0) {
            continue;
        }
        let Ok((stream, _)) = listener.accept() else {
            continue;
        };
        let _ = stream.set_nonblocking(false);
        in_flight.fetch_add(1, Ordering::SeqCst);
        let (in_flight, version) = (in_flight.clone(), version.clone());
        std::thread::spawn(move || {
            serve(stream, &version);
            in_flight.fetch_sub(1, Ordering::SeqCst);
        });
    }
    // Closing the listener hands its queued connections to the successor.
    drop(listener);
    while in_flight.load(Ordering::SeqCst) > 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!("rigger-lab-sidecar {version}: drained");
}
