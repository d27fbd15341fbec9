//! Writing loose Git objects with *stored* (level 0) deflate.
//!
//! Projections are ephemeral, and zlib compression was most of an export's time, so the
//! projector writes blobs as zlib streams made of stored blocks: a valid loose object for
//! every Git implementation, as large as the content. The encoding is pure; only
//! [`write_loose_blob`] touches the filesystem.

use std::{
    fs,
    io::{self, Write},
    path::Path,
};

/// Largest payload of one stored deflate block.
const STORED_BLOCK: usize = 65_535;

/// Adler-32 (RFC 1950) of the concatenation of `parts` (SIMD where the CPU has it); the
/// encoder computes it piece by piece, tests check it against this.
#[cfg(test)]
fn adler32(parts: &[&[u8]]) -> u32 {
    parts
        .iter()
        .fold(1, |adler, part| zlib_rs::adler32::adler32(adler, part))
}

/// A zlib stream of stored blocks whose length is announced up front, written in pieces of any
/// size: each block header goes out when its first byte does, so nothing is buffered. The same
/// content gives the same bytes however it is split ([`write_stored_zlib`] is this encoder fed
/// at once).
pub(crate) struct StoredZlib {
    /// Bytes announced and not yet covered by a block header.
    unstarted: u64,
    /// Bytes still to write in the current block.
    block_left: usize,
    /// Whether a block header has been written (an empty stream still needs one).
    any_block: bool,
    adler: u32,
}

impl StoredZlib {
    /// Writes the zlib header of a stream that will hold exactly `total` bytes.
    pub(crate) fn begin(out: &mut impl Write, total: u64) -> io::Result<Self> {
        out.write_all(&[0x78, 0x01])?;
        Ok(Self {
            unstarted: total,
            block_left: 0,
            any_block: false,
            adler: 1,
        })
    }

    fn start_block(&mut self, out: &mut impl Write) -> io::Result<()> {
        let len = usize::try_from(self.unstarted.min(STORED_BLOCK as u64)).unwrap_or(STORED_BLOCK);
        self.unstarted -= len as u64;
        let len16 = u16::try_from(len).unwrap_or(u16::MAX);
        out.write_all(&[u8::from(self.unstarted == 0)])?;
        out.write_all(&len16.to_le_bytes())?;
        out.write_all(&(!len16).to_le_bytes())?;
        self.block_left = len;
        self.any_block = true;
        Ok(())
    }

    /// Writes the next piece of the content. More than announced is an error.
    pub(crate) fn write(&mut self, out: &mut impl Write, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            if self.block_left == 0 {
                if self.unstarted == 0 {
                    return Err(io::Error::other(
                        "more bytes were written than the stored zlib stream announced",
                    ));
                }
                self.start_block(out)?;
            }
            let take = self.block_left.min(data.len());
            out.write_all(&data[..take])?;
            self.adler = zlib_rs::adler32::adler32(self.adler, &data[..take]);
            self.block_left -= take;
            data = &data[take..];
        }
        Ok(())
    }

    /// Ends the stream (the Adler-32 trailer). Fewer bytes than announced is an error.
    pub(crate) fn finish(mut self, out: &mut impl Write) -> io::Result<()> {
        if self.unstarted != 0 || self.block_left != 0 {
            return Err(io::Error::other(
                "fewer bytes were written than the stored zlib stream announced",
            ));
        }
        if !self.any_block {
            self.start_block(out)?;
        }
        out.write_all(&self.adler.to_be_bytes())
    }
}

/// Writes the zlib stream (stored blocks only) of the concatenation of `parts` to `out`.
pub(crate) fn write_stored_zlib(out: &mut impl Write, parts: &[&[u8]]) -> io::Result<()> {
    let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let mut zlib = StoredZlib::begin(out, total)?;
    for part in parts {
        zlib.write(out, part)?;
    }
    zlib.finish(out)
}

/// The bytes of a loose object file for a blob: zlib(stored) of `"blob <len>\0" ‖ content`.
pub fn encode_loose_blob(content: &[u8]) -> Vec<u8> {
    let header = format!("blob {}\0", content.len());
    let mut out = Vec::with_capacity(header.len() + content.len() + 64);
    // Writing into a Vec cannot fail.
    let _ = write_stored_zlib(&mut out, &[header.as_bytes(), content]);
    out
}

/// Writes `content` as loose blob `id_hex` under `objects_dir` (`objects/xx/yyyy…`), streaming
/// the stored-deflate encoding (no second copy of the content in memory). The caller vouches
/// that `id_hex` is the blob's ID.
pub fn write_loose_blob(objects_dir: &Path, id_hex: &str, content: &[u8]) -> io::Result<()> {
    let (dir, file) = id_hex.split_at(2.min(id_hex.len()));
    let dir = objects_dir.join(dir);
    fs::create_dir_all(&dir)?;
    let header = format!("blob {}\0", content.len());
    let mut out = io::BufWriter::with_capacity(1 << 16, fs::File::create(dir.join(file))?);
    write_stored_zlib(&mut out, &[header.as_bytes(), content])?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adler32_matches_the_rfc_example() {
        assert_eq!(adler32(&[b"Wikipedia"]), 0x11E6_0398);
        assert_eq!(adler32(&[b"Wiki", b"pedia"]), 0x11E6_0398);
        assert_eq!(adler32(&[]), 1);
    }

    /// The encoding before [`StoredZlib`]: every block written from the whole content at once.
    fn stored_zlib_at_once(content: &[u8]) -> Vec<u8> {
        let blocks = content.len().div_ceil(STORED_BLOCK).max(1);
        let mut out = vec![0x78, 0x01];
        for (n, block) in (0..blocks).map(|n| {
            let start = n * STORED_BLOCK;
            (
                n,
                &content[start..(start + STORED_BLOCK).min(content.len())],
            )
        }) {
            let len = block.len() as u16;
            out.push(u8::from(n + 1 == blocks));
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&(!len).to_le_bytes());
            out.extend_from_slice(block);
        }
        out.extend_from_slice(&adler32(&[content]).to_be_bytes());
        out
    }

    #[test]
    fn a_stored_stream_written_in_pieces_of_any_size_is_the_stream_written_at_once() {
        for size in [0usize, 1, 65_534, 65_535, 65_536, 131_070, 131_071, 300_001] {
            let content: Vec<u8> = (0..size).map(|i| (i * 11 % 253) as u8).collect();
            let expected = stored_zlib_at_once(&content);
            for piece in [1usize, 7, 65_535, 65_536, 1 << 20] {
                let mut out = Vec::new();
                let mut zlib = StoredZlib::begin(&mut out, size as u64).unwrap();
                for chunk in content.chunks(piece) {
                    zlib.write(&mut out, chunk).unwrap();
                }
                zlib.finish(&mut out).unwrap();
                assert!(out == expected, "size {size}, pieces of {piece}");
            }
            let mut out = Vec::new();
            write_stored_zlib(&mut out, &[&content[..size / 3], &content[size / 3..]]).unwrap();
            assert!(out == expected, "size {size} in two parts");
            // What zlib decodes is the content.
            let mut inflate = zlib_rs::Inflate::new(true, 15);
            let mut decoded = vec![0u8; size + 1];
            let status = inflate
                .decompress(&out, &mut decoded, zlib_rs::InflateFlush::Finish)
                .unwrap();
            assert_eq!(status, zlib_rs::Status::StreamEnd, "size {size}");
            assert_eq!(inflate.total_out() as usize, size);
            assert!(decoded[..size] == content[..], "size {size}");
        }
    }

    #[test]
    fn a_stored_stream_refuses_more_or_fewer_bytes_than_announced() {
        let mut out = Vec::new();
        let mut zlib = StoredZlib::begin(&mut out, 3).unwrap();
        zlib.write(&mut out, b"ab").unwrap();
        let short = zlib.finish(&mut out).unwrap_err();
        assert!(short.to_string().contains("fewer bytes"), "{short}");
        let mut zlib = StoredZlib::begin(&mut out, 3).unwrap();
        let long = zlib.write(&mut out, b"abcd").unwrap_err();
        assert!(long.to_string().contains("more bytes"), "{long}");
    }

    #[test]
    fn git_reads_stored_loose_objects_of_every_size() {
        let dir = tempfile::TempDir::new().unwrap();
        let repo = git2::Repository::init_bare(dir.path()).unwrap();
        for size in [0usize, 1, 65_520, 65_535, 65_536, 200_000] {
            let content: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
            let id = git2::Oid::hash_object(git2::ObjectType::Blob, &content).unwrap();
            let objects = dir.path().join("objects");
            let hex_id = id.to_string();
            write_loose_blob(&objects, &hex_id, &content).unwrap();
            let written = std::fs::read(objects.join(&hex_id[..2]).join(&hex_id[2..])).unwrap();
            assert_eq!(written, encode_loose_blob(&content), "size {size}");
            let blob = repo.find_blob(id).unwrap();
            assert_eq!(blob.content(), content.as_slice(), "size {size}");
        }
    }
}
