//! `rigger-bench-apply [--dirs 200] [--files 100] [--runs 5] [--dir DIR]`: the layer
//! applier (rigger-layer, descriptors only) against GNU tar extracting the same archive
//! (`tar -xpf --same-owner`), in the same run, into the same directory. What it
//! measures is the cost per entry: run it with `--dir` on a tmpfs (`mount -t tmpfs
//! tmpfs /mnt/x`), or a slow disk's metadata writes are all it shows.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;

#[derive(Parser, Debug)]
struct Args {
    /// Directories in the layer.
    #[arg(long, default_value_t = 200)]
    dirs: usize,
    /// Files of 10 bytes in each directory.
    #[arg(long, default_value_t = 100)]
    files: usize,
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Where to unpack (a tmpfs, to measure CPU rather than the disk).
    #[arg(long, default_value = "/tmp")]
    dir: PathBuf,
}

fn layer(dirs: usize, files: usize) -> anyhow::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let header = |kind, mode, size| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        h
    };
    for d in 0..dirs {
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        builder.append_data(&mut h, format!("usr/share/d{d}/"), &b""[..])?;
        for f in 0..files {
            let mut h = header(tar::EntryType::Regular, 0o644, 10);
            builder.append_data(&mut h, format!("usr/share/d{d}/f{f}"), &b"0123456789"[..])?;
        }
    }
    Ok(builder.into_inner()?)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn fresh(dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    if path.exists() {
        std::fs::remove_dir_all(&path)?;
    }
    std::fs::create_dir_all(&path)?;
    Ok(path)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let work = tempfile::tempdir_in(&args.dir)
        .with_context(|| format!("a work directory in {}", args.dir.display()))?;
    let bytes = layer(args.dirs, args.files)?;
    let archive = work.path().join("layer.tar");
    std::fs::write(&archive, &bytes)?;
    let entries = args.dirs * (args.files + 1);
    let (mut ours, mut tar) = (Vec::new(), Vec::new());
    for _ in 0..args.runs {
        let root = fresh(work.path(), "rigger")?;
        let start = Instant::now();
        rigger_layer::apply_layer(
            &bytes[..],
            &rigger_layer::ApplyTarget {
                root,
                lowers: Vec::new(),
                bottom: true,
            },
        )?;
        ours.push(start.elapsed());
        let root = fresh(work.path(), "gnu-tar")?;
        let start = Instant::now();
        let status = std::process::Command::new("tar")
            .arg("-C")
            .arg(&root)
            .args(["-xpf"])
            .arg(&archive)
            .arg("--same-owner")
            .status()?;
        if !status.success() {
            bail!("tar -xpf failed: {status}");
        }
        tar.push(start.elapsed());
    }
    let (ours, tar) = (median(ours), median(tar));
    println!(
        "{entries} entries into {}: rigger-layer {:.0} ms ({:.1} µs/entry), GNU tar {:.0} ms ({:.1} µs/entry), ratio {:.2}",
        args.dir.display(),
        ours.as_secs_f64() * 1e3,
        ours.as_secs_f64() * 1e6 / entries as f64,
        tar.as_secs_f64() * 1e3,
        tar.as_secs_f64() * 1e6 / entries as f64,
        ours.as_secs_f64() / tar.as_secs_f64(),
    );
    Ok(())
}
