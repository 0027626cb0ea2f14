//! The least CPU a pull's work needs, whatever the tool: for each layer file given, the
//! compressed digest, the blob written, inflate (ISA-L, as Rigger and containerd 2.x use)
//! and the layer's files written with their diff ID (`rigger_layer`, descriptors only) —
//! in one process, no network, no containerd. Layers run on as many threads as the
//! machine has cores; a layer's steps (digest and blob, inflate, files) on threads of
//! their own, at once.
//!
//!   rigger-bench-floor --scratch DIR LAYER:MEDIA_TYPE...
//!
//! Prints one JSON line: `cpu_seconds` (the process's user and system time), `wall_seconds`
//! and `longest_layer_seconds` (the CPU time of the longest step of any layer).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context as _, bail};
use clap::Parser;
use rigger_layer::{ApplyTarget, apply_layer};
use rigger_pull::media::layer_compression;
use rigger_pull::stack::decompress::decompress;
use sha2::Digest as _;

#[derive(Parser)]
struct Args {
    /// Where the layers' blobs and files are written (removed after).
    #[arg(long)]
    scratch: PathBuf,
    /// `PATH:MEDIA_TYPE` of each compressed layer.
    #[arg(required = true)]
    layers: Vec<String>,
}

/// A thread's own CPU time so far.
fn thread_cpu() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(0.0, |t| t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9)
}

/// Inflated bytes handed from the inflating thread to the applying one, as a `Read`; the
/// buffers go back to be filled again (no allocation or zeroing counted per chunk).
struct Handed {
    chunks: std::sync::mpsc::Receiver<Vec<u8>>,
    back: std::sync::mpsc::Sender<Vec<u8>>,
    current: std::io::Cursor<Vec<u8>>,
}

impl std::io::Read for Handed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let n = self.current.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            match self.chunks.recv() {
                Ok(chunk) => {
                    let used = std::mem::replace(&mut self.current, std::io::Cursor::new(chunk));
                    let _ = self.back.send(used.into_inner());
                }
                Err(_) => return Ok(0),
            }
        }
    }
}

/// One layer's work as a pull spreads it over threads: the compressed bytes' digest and
/// blob on one, inflate on another, the diff ID and the files on a third, all at once.
/// Its time is its longest step's CPU time, not the steps chained on one thread (which
/// overstated the floor of one big layer). Still a little generous to the floor's side:
/// a tool could split a step further (the diff ID from the files), and the hand-over
/// below copies each inflated byte once more.
fn one_layer(path: &str, media_type: &str, out: &std::path::Path) -> anyhow::Result<f64> {
    use std::io::Read as _;
    let compressed: std::sync::Arc<[u8]> =
        std::fs::read(path).with_context(|| path.to_owned())?.into();
    std::fs::create_dir(out.join("root"))?;
    let compression = layer_compression(media_type).map_err(|e| anyhow::anyhow!("{e}"))?;
    const CHUNK: usize = 1 << 20;
    let (chunks_tx, chunks) = std::sync::mpsc::sync_channel::<Vec<u8>>(8);
    let (back, returned) = std::sync::mpsc::channel::<Vec<u8>>();
    // (an `Arc` clone: the inflating thread reads the blob's bytes)
    let inflated_from = compressed.clone();
    std::thread::scope(|scope| -> anyhow::Result<f64> {
        let blob = scope.spawn(|| -> anyhow::Result<f64> {
            let start = thread_cpu();
            std::hint::black_box(sha2::Sha256::digest(&*compressed));
            std::fs::write(out.join("blob"), &*compressed)?;
            Ok(thread_cpu() - start)
        });
        let inflate = scope.spawn(move || -> anyhow::Result<f64> {
            let start = thread_cpu();
            let mut reader = decompress(compression, std::io::Cursor::new(inflated_from))?;
            loop {
                let mut chunk = returned
                    .try_recv()
                    .ok()
                    .filter(|c| c.len() == CHUNK)
                    .unwrap_or_else(|| vec![0u8; CHUNK]);
                let mut filled = 0;
                while filled < CHUNK {
                    match reader.read(&mut chunk[filled..])? {
                        0 => break,
                        n => filled += n,
                    }
                }
                let end = filled < CHUNK;
                chunk.truncate(filled);
                if filled > 0 && chunks_tx.send(chunk).is_err() {
                    break;
                }
                if end {
                    break;
                }
            }
            drop(chunks_tx);
            Ok(thread_cpu() - start)
        });
        let start = thread_cpu();
        let target = ApplyTarget {
            root: out.join("root"),
            lowers: Vec::new(),
            bottom: true,
        };
        let handed = Handed {
            chunks,
            back,
            current: std::io::Cursor::new(Vec::new()),
        };
        let applied = apply_layer(handed, &target);
        let apply = thread_cpu() - start;
        let joined =
            |side: std::thread::ScopedJoinHandle<'_, anyhow::Result<f64>>| match side.join() {
                Ok(result) => result,
                Err(_) => bail!("a layer's thread panicked"),
            };
        // An inflate error shows to the applier as a short tar: the inflater says first.
        let inflate = joined(inflate)?;
        applied.with_context(|| format!("applying {path}"))?;
        Ok(apply.max(joined(blob)?).max(inflate))
    })
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let layers: Vec<(String, String)> = args
        .layers
        .iter()
        .map(|l| {
            let (path, media) = l.rsplit_once(':').context("LAYER:MEDIA_TYPE")?;
            Ok((path.to_owned(), media.to_owned()))
        })
        .collect::<anyhow::Result<_>>()?;
    let queue = Mutex::new(layers.into_iter().enumerate().collect::<Vec<_>>());
    let longest = Mutex::new(0f64);
    let start = Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> anyhow::Result<()> {
                    loop {
                        let Some((i, (path, media))) = queue.lock().ok().and_then(|mut q| q.pop())
                        else {
                            return Ok(());
                        };
                        let out = args.scratch.join(format!("layer-{i}"));
                        std::fs::create_dir_all(&out)?;
                        let seconds = one_layer(&path, &media, &out)?;
                        if let Ok(mut longest) = longest.lock() {
                            *longest = longest.max(seconds);
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            match worker.join() {
                Ok(result) => result?,
                Err(_) => bail!("a layer's thread panicked"),
            }
        }
        Ok(())
    })?;
    let wall = start.elapsed().as_secs_f64();
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)?;
    let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    let cpu = seconds(usage.user_time()) + seconds(usage.system_time());
    let longest = longest.lock().map_or(0.0, |l| *l);
    println!(
        "{}",
        serde_json::json!({"cpu_seconds": cpu, "wall_seconds": wall, "longest_layer_seconds": longest})
    );
    Ok(())
}
