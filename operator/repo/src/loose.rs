//! Writing loose Git objects with *stored* (level 0) deflate.
//!
//! Projections are ephemeral, and zlib compression was most of an export's time, so the
//! projector writes blobs as zlib streams made of stored blocks: a valid loose object for
//! every Git implementation, as large as the content. The encoding is pure; only
//! [`write_loose_object`] touches the filesystem.

use std::{fs, io, path::Path};

/// Largest payload of one stored deflate block.
const STORED_BLOCK: usize = 65_535;

/// Adler-32 of `data` (RFC 1950).
fn adler32(parts: &[&[u8]]) -> u32 {
    const MOD: u32 = 65_521;
    let (mut a, mut b) = (1u32, 0u32);
    for part in parts {
        // 5552 is the largest n with 255·n·(n+1)/2 + (n+1)·(MOD−1) < 2^32.
        for chunk in part.chunks(5552) {
            for &byte in chunk {
                a += u32::from(byte);
                b += a;
            }
            a %= MOD;
            b %= MOD;
        }
    }
    (b << 16) | a
}

/// The bytes of a loose object file for a blob: zlib(stored) of `"blob <len>\0" ‖ content`.
pub fn encode_loose_blob(content: &[u8]) -> Vec<u8> {
    let header = format!("blob {}\0", content.len());
    let total = header.len() + content.len();
    let blocks = total.div_ceil(STORED_BLOCK).max(1);
    let mut out = Vec::with_capacity(2 + total + blocks * 5 + 4);
    out.extend_from_slice(&[0x78, 0x01]);
    let mut remaining = total;
    let mut sources = [header.as_bytes(), content];
    let mut source = 0;
    for block in 0..blocks {
        let len = remaining.min(STORED_BLOCK);
        remaining -= len;
        out.push(u8::from(block + 1 == blocks));
        out.extend_from_slice(&(len as u16).to_le_bytes());
        out.extend_from_slice(&(!(len as u16)).to_le_bytes());
        let mut need = len;
        while need > 0 {
            let take = need.min(sources[source].len());
            out.extend_from_slice(&sources[source][..take]);
            sources[source] = &sources[source][take..];
            need -= take;
            if sources[source].is_empty() && source + 1 < sources.len() {
                source += 1;
            }
        }
    }
    out.extend_from_slice(&adler32(&[header.as_bytes(), content]).to_be_bytes());
    out
}

/// Writes `encoded` as loose object `id_hex` under `objects_dir` (`objects/xx/yyyy…`).
pub fn write_loose_object(objects_dir: &Path, id_hex: &str, encoded: &[u8]) -> io::Result<()> {
    let (dir, file) = id_hex.split_at(2.min(id_hex.len()));
    let dir = objects_dir.join(dir);
    fs::create_dir_all(&dir)?;
    fs::write(dir.join(file), encoded)
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

    #[test]
    fn git_reads_stored_loose_objects_of_every_size() {
        let dir = tempfile::TempDir::new().unwrap();
        let repo = git2::Repository::init_bare(dir.path()).unwrap();
        for size in [0usize, 1, 65_520, 65_535, 65_536, 200_000] {
            let content: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
            let id = git2::Oid::hash_object(git2::ObjectType::Blob, &content).unwrap();
            write_loose_object(
                &dir.path().join("objects"),
                &id.to_string(),
                &encode_loose_blob(&content),
            )
            .unwrap();
            let blob = repo.find_blob(id).unwrap();
            assert_eq!(blob.content(), content.as_slice(), "size {size}");
        }
    }
}
