//! A served connection whose reader stops reading is let go: an answer's writes must
//! move at least [`MIN_PROGRESS`] bytes per [`WINDOW`] while they wait, or the
//! connection fails. Otherwise a peer that asks for a blob and never reads it (or
//! reads a byte now and then) holds a serving slot, and the blob's read from
//! containerd, for as long as it likes.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// How long a window of writing lasts.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Bytes a reader must take per window while the answer waits on it.
pub const MIN_PROGRESS: u64 = 64 << 10;

/// `io` whose writes fail once a window passes with less than [`MIN_PROGRESS`] written
/// while a write waited.
#[derive(Debug)]
pub struct EvictSlowReaders<IO> {
    io: IO,
    window_start: Instant,
    written: u64,
    /// Armed while a write waits for the reader.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<IO> EvictSlowReaders<IO> {
    pub fn new(io: IO) -> Self {
        Self {
            io,
            window_start: Instant::now(),
            written: 0,
            deadline: None,
        }
    }

    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// Bytes went out: a window that moved enough starts a new one.
    fn progressed(&mut self, bytes: usize) {
        self.written = self.written.saturating_add(bytes as u64);
        if self.written >= MIN_PROGRESS || self.window_start.elapsed() >= WINDOW {
            self.window_start = Instant::now();
            self.written = 0;
            self.deadline = None;
        }
    }

    /// A write waits: fails when the window ends before the reader took enough.
    fn waiting(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        // A connection idle between answers starts its window when a write first waits.
        if self.deadline.is_none() && self.window_start.elapsed() >= WINDOW {
            self.window_start = Instant::now();
            self.written = 0;
        }
        let end = self.window_start + WINDOW;
        let deadline = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(end)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the peer read less than {} KiB in {} s: connection closed",
                    MIN_PROGRESS >> 10,
                    WINDOW.as_secs()
                ),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for EvictSlowReaders<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for EvictSlowReaders<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                self.progressed(n);
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.waiting(cx),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Pending => self.waiting(cx).map_ok(drop),
            ready => ready,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_stops_reading_is_let_go_within_a_window() {
        let (near, mut far) = tokio::io::duplex(1024);
        let mut watched = EvictSlowReaders::new(near);
        let writing = tokio::spawn(async move {
            let chunk = vec![7u8; 4096];
            loop {
                watched.write_all(&chunk).await?;
            }
            #[allow(unreachable_code)]
            Ok::<(), std::io::Error>(())
        });
        // The reader takes a little, then nothing.
        let mut first = [0u8; 100];
        far.read_exact(&mut first).await.unwrap();
        tokio::time::sleep(WINDOW + Duration::from_secs(1)).await;
        let error = writing.await.unwrap().unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_keeps_up_is_served_to_the_end() {
        let (near, mut far) = tokio::io::duplex(64 << 10);
        let mut watched = EvictSlowReaders::new(near);
        let total = 4 * MIN_PROGRESS as usize;
        let writing = tokio::spawn(async move {
            watched.write_all(&vec![1u8; total]).await?;
            watched.shutdown().await
        });
        let mut got = Vec::new();
        // Slower than the socket, faster than the floor.
        let mut piece = vec![0u8; 32 << 10];
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let n = far.read(&mut piece).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&piece[..n]);
        }
        writing.await.unwrap().unwrap();
        assert_eq!(got.len(), total);
    }
}
