//! The least CPU a pull's work needs, whatever the tool: for each layer file given, the
//! compressed digest, the blob written, inflate (ISA-L, as Rigger and containerd 2.x use)
//! and the layer's files written with their diff ID (`rigger_layer`, descriptors only) —
//! in one process, no network, no containerd, no pipes between steps. Layers run on as
//! many threads as the machine has cores; a layer's compressed side and its unpack at
//! once.
//!
//!   rigger-bench-floor --scratch DIR LAYER:MEDIA_TYPE...
//!
//! Prints one JSON line: `cpu_seconds` (the process's user and system time), `wall_seconds`
//! and `longest_layer_seconds` (the slowest layer's own time).

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

/// One layer's work, its two sides at once as a pull does them (the compressed bytes'
/// digest and blob on one thread; inflate, the diff ID and the files on another): its
/// time is its longer side.
fn one_layer(path: &str, media_type: &str, out: &std::path::Path) -> anyhow::Result<f64> {
    let start = Instant::now();
    let compressed: std::sync::Arc<[u8]> =
        std::fs::read(path).with_context(|| path.to_owned())?.into();
    std::fs::create_dir(out.join("root"))?;
    let compression = layer_compression(media_type).map_err(|e| anyhow::anyhow!("{e}"))?;
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let blob = scope.spawn(|| -> anyhow::Result<()> {
            std::hint::black_box(sha2::Sha256::digest(&*compressed));
            std::fs::write(out.join("blob"), &*compressed)?;
            Ok(())
        });
        let reader = decompress(compression, std::io::Cursor::new(compressed.clone()))?;
        // (an `Arc` clone: the unpack reads the same bytes)
        let target = ApplyTarget {
            root: out.join("root"),
            lowers: Vec::new(),
            bottom: true,
        };
        apply_layer(reader, &target).with_context(|| format!("applying {path}"))?;
        match blob.join() {
            Ok(result) => result,
            Err(_) => bail!("the blob's thread panicked"),
        }
    })?;
    Ok(start.elapsed().as_secs_f64())
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
