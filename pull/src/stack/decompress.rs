//! A layer's bytes, decompressed as containerd decompresses them: gzip (every member of a
//! multi-member stream, each checked against its CRC-32 and length, as Go's reader
//! does), zstd, or none.
//!
//! gzip inflates through ISA-L (`isal-rs`, Debian's `libisal2`), which on the CPUs nodes
//! run on is ~2.5x zlib's speed; a layer's inflate is on the critical path of its unpack
//! (docs/benchmarks/containerd-2.1-where-the-time-goes.md). Two things keep ISA-L's
//! reader exact:
//! - its input is always as full as the layer allows ([`FullReads`]): the reader counts a
//!   step that produced no output as a sign of corrupt input, and a short read (the end
//!   of a network piece) could otherwise starve a step and fail a good layer;
//! - it goes into the returned `Box` before its first read, and nothing can take it out
//!   again (the box is a trait object): it points into its own input buffer between
//!   reads, so it must never move.

use std::io::{self, Read};

use crate::media::Compression;

/// A reader of the uncompressed layer (on the thread that made it: ISA-L's state is not `Send`).
pub type Decompressed = Box<dyn Read>;

/// Decompress `reader` according to `compression`.
pub fn decompress<R: Read + 'static>(
    compression: Compression,
    reader: R,
) -> io::Result<Decompressed> {
    Ok(match compression {
        Compression::None => Box::new(reader),
        Compression::Gzip => Box::new(Gzip(isal::read::GzipDecoder::new(FullReads(reader)))),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(reader)?),
    })
}

/// ISA-L's gzip reader with its errors made `io::Error`s that say what was wrong.
struct Gzip<R: Read>(isal::read::GzipDecoder<FullReads<R>>);

impl<R: Read> Read for Gzip<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf).map_err(|e| {
            if e.kind() == io::ErrorKind::Other || e.kind() == io::ErrorKind::InvalidData {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("the gzip stream is corrupt or truncated: {e}"),
                )
            } else {
                e
            }
        })
    }
}

/// Reads that fill the whole buffer unless the stream ends first.
struct FullReads<R>(R);

impl<R: Read> Read for FullReads<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.0.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(filled)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::Compression as Level;
    use flate2::write::GzEncoder;

    use super::*;

    /// Gives its data in pieces of the given sizes, in turn (a network's reads).
    struct Pieces {
        data: Vec<u8>,
        at: usize,
        sizes: Vec<usize>,
        turn: usize,
    }

    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let size = self.sizes[self.turn % self.sizes.len()];
            self.turn += 1;
            let n = size.min(buf.len()).min(self.data.len() - self.at);
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    fn gzip(data: &[u8], level: u32) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Level::new(level));
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    /// Half text, half noise: what layers hold, compressible and not.
    fn layer_like(len: usize, seed: u64) -> Vec<u8> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let text = b"usr/lib/x86_64-linux-gnu/libexample.so.1 the quick brown fox ";
        (0..len)
            .map(|i| {
                if (i / 4096) % 2 == 0 {
                    text[i % text.len()]
                } else {
                    rng.u8(..)
                }
            })
            .collect()
    }

    fn inflate(compressed: Vec<u8>, sizes: Vec<usize>, read_size: usize) -> io::Result<Vec<u8>> {
        let reader = Pieces {
            data: compressed,
            at: 0,
            sizes,
            turn: 0,
        };
        let mut decoder = decompress(Compression::Gzip, reader)?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; read_size];
        loop {
            let n = decoder.read(&mut buf)?;
            if n == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    #[test]
    fn a_layer_inflates_the_same_whatever_the_network_and_reader_piece_sizes() {
        let data = layer_like(3 << 20, 1);
        for level in [0, 1, 6, 9] {
            let compressed = gzip(&data, level);
            for (sizes, read_size) in [
                (vec![1 << 20], 1 << 20),
                (vec![1], 512),
                (vec![7, 3, 65536, 1, 13], 8192),
                (vec![256 << 10, 5], 100),
            ] {
                let out = inflate(compressed.clone(), sizes.clone(), read_size)
                    .unwrap_or_else(|e| panic!("level {level}, pieces {sizes:?}: {e}"));
                assert!(
                    out == data,
                    "level {level}, pieces {sizes:?}: output differs"
                );
            }
        }
    }

    #[test]
    fn every_member_of_a_multi_member_stream_is_read_as_go_does() {
        let parts = [
            layer_like(100_000, 2),
            Vec::new(),
            Vec::new(),
            layer_like(5, 3),
        ];
        let mut compressed = Vec::new();
        for part in &parts {
            compressed.extend(gzip(part, 6));
        }
        let out = inflate(compressed, vec![3, 1000], 4096).unwrap();
        assert_eq!(out, parts.concat());
    }

    #[test]
    fn an_empty_layer_is_empty_and_an_empty_blob_is_not_gzip() {
        assert!(inflate(gzip(b"", 6), vec![1], 512).unwrap().is_empty());
        // Go's gzip.NewReader refuses an empty stream (io.EOF), and so containerd.
        assert!(inflate(Vec::new(), vec![1], 512).is_err());
    }

    #[test]
    fn a_truncated_stream_is_an_error_wherever_it_stops() {
        let compressed = gzip(&layer_like(200_000, 4), 6);
        for cut in [
            1,
            10,
            11,
            5000,
            compressed.len() / 2,
            compressed.len() - 8,
            compressed.len() - 1,
        ] {
            let result = inflate(compressed[..cut].to_vec(), vec![4096], 8192);
            assert!(
                result.is_err(),
                "cut at {cut} of {} was accepted",
                compressed.len()
            );
        }
    }

    #[test]
    fn a_wrong_checksum_or_length_is_an_error() {
        let mut compressed = gzip(&layer_like(50_000, 5), 6);
        let n = compressed.len();
        compressed[n - 8] ^= 1; // CRC-32
        assert!(inflate(compressed.clone(), vec![4096], 8192).is_err());
        compressed[n - 8] ^= 1;
        compressed[n - 1] ^= 1; // ISIZE
        assert!(inflate(compressed, vec![4096], 8192).is_err());
    }

    #[test]
    fn garbage_after_the_last_member_is_an_error_as_in_go() {
        for trailer in [&b"not gzip"[..], &[0u8; 512][..]] {
            let mut compressed = gzip(&layer_like(10_000, 6), 6);
            compressed.extend_from_slice(trailer);
            assert!(inflate(compressed, vec![4096], 8192).is_err());
        }
    }

    #[test]
    fn corrupt_deflate_data_is_an_error_not_a_hang() {
        let mut compressed = gzip(&layer_like(100_000, 7), 6);
        for i in (20..compressed.len() - 8).step_by(997) {
            compressed[i] = compressed[i].wrapping_add(0x55);
        }
        assert!(inflate(compressed, vec![4096], 8192).is_err());
        let mut random = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];
        random.extend(layer_like(10_000, 8).iter().rev());
        assert!(inflate(random, vec![333], 8192).is_err());
    }

    #[test]
    fn uncompressed_and_zstd_layers_pass_through_their_own_readers() {
        let data = layer_like(100_000, 9);
        let mut plain = decompress(Compression::None, io::Cursor::new(data.clone())).unwrap();
        let mut out = Vec::new();
        plain.read_to_end(&mut out).unwrap();
        assert_eq!(out, data);
        let compressed = zstd::encode_all(&data[..], 3).unwrap();
        let mut zst = decompress(Compression::Zstd, io::Cursor::new(compressed)).unwrap();
        out.clear();
        zst.read_to_end(&mut out).unwrap();
        assert_eq!(out, data);
    }
}
