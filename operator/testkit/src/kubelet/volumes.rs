//! Pod volumes as host directories: `emptyDir` becomes a fresh directory,
//! `configMap` and `secret` are projected as files (one per key), `hostPath`
//! is used as is, and a `persistentVolumeClaim` is the node's directory for
//! that claim (`<claims root>/<namespace>/<claimName>`, created on first use
//! and kept across pods, like a local-path provisioner). Other volume types
//! are reported as unsupported.
//!
//! [`Images`] are the node's container images: the files a container of an image finds at
//! which paths. Each directory of an image is unpacked once under the kubelet's root and
//! mounted read-only at its path, in front of the volumes, so it shadows what the host has
//! there (the executors show every container the host's `/usr` read-only; a container of an
//! image holding `/usr/local/bin/protobot` sees the image's `/usr/local/bin` instead).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde_json::Value;

use super::backend::Lookup;

/// The node's container images, by reference: each maps container paths to host files.
/// A container whose image is not listed sees only what its executor gives every
/// container (the host's `/usr` read-only under bubblewrap).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Images {
    files: BTreeMap<String, BTreeMap<String, PathBuf>>,
}

impl Images {
    /// No images.
    pub fn new() -> Self {
        Self::default()
    }

    /// `image` holds `host_file` at `container_path` (an absolute path without `..`), e.g.
    /// the operator's image holding this build's `protobot` at `/usr/local/bin/protobot`.
    /// The file's directory in the image holds only what is added for it here.
    pub fn with_file(
        mut self,
        image: impl Into<String>,
        container_path: impl Into<String>,
        host_file: impl Into<PathBuf>,
    ) -> Self {
        self.files
            .entry(image.into())
            .or_default()
            .insert(container_path.into(), host_file.into());
        self
    }

    /// Unpacks every image under `root` (one directory per image directory, its files hard
    /// linked, else copied): image → `(container directory, host directory)`.
    pub(crate) fn unpack(&self, root: &Path) -> Result<Unpacked, String> {
        let mut out = Unpacked::new();
        for (n, (image, files)) in self.files.iter().enumerate() {
            let mut dirs: BTreeMap<String, PathBuf> = BTreeMap::new();
            for (container_path, host_file) in files {
                let path = Path::new(container_path);
                let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
                    return Err(format!(
                        "image {image}: {container_path:?} names no file in a directory"
                    ));
                };
                if !path.is_absolute()
                    || path
                        .components()
                        .any(|c| matches!(c, std::path::Component::ParentDir))
                {
                    return Err(format!(
                        "image {image}: {container_path:?} must be an absolute path without '..'"
                    ));
                }
                let container_dir = dir.to_string_lossy().into_owned();
                let host_dir = root
                    .join(n.to_string())
                    .join(dir.strip_prefix("/").unwrap_or(dir));
                std::fs::create_dir_all(&host_dir)
                    .map_err(|e| format!("image {image}: creating {}: {e}", host_dir.display()))?;
                let target = host_dir.join(name);
                if std::fs::hard_link(host_file, &target).is_err() {
                    std::fs::copy(host_file, &target).map_err(|e| {
                        format!(
                            "image {image}: {container_path} from {}: {e}",
                            host_file.display()
                        )
                    })?;
                }
                dirs.insert(container_dir, host_dir);
            }
            out.insert(image.clone(), dirs.into_iter().collect());
        }
        Ok(out)
    }
}

/// Unpacked images: image → its directories, `(container path, host directory)`.
pub(crate) type Unpacked = BTreeMap<String, Vec<(String, PathBuf)>>;

/// Decode standard base64 (Secret `data`); `None` on malformed input.
pub fn decode_base64(input: &str) -> Option<Vec<u8>> {
    fn val(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let clean: Vec<u8> = input.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let trimmed: &[u8] = {
        let mut end = clean.len();
        while end > 0 && clean[end - 1] == b'=' {
            end -= 1;
        }
        &clean[..end]
    };
    let mut out = Vec::with_capacity(trimmed.len() * 3 / 4);
    for chunk in trimmed.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= val(*c)? << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        match chunk.len() {
            4 => out.extend_from_slice(&bytes[1..4]),
            3 => out.extend_from_slice(&bytes[1..3]),
            2 => out.push(bytes[1]),
            _ => return None,
        }
    }
    Some(out)
}

fn project(
    shared: &Lookup,
    plural: &str,
    namespace: &str,
    name: &str,
    optional: bool,
    dir: &Path,
) -> Result<(), String> {
    let obj = shared.object(plural, namespace, name);
    let Some(obj) = obj else {
        return if optional {
            Ok(())
        } else {
            Err(format!("{plural} \"{name}\" not found"))
        };
    };
    let write = |k: &str, bytes: &[u8]| {
        std::fs::write(dir.join(k), bytes).map_err(|e| format!("failed to write {k}: {e}"))
    };
    if let Some(data) = obj.get("stringData").and_then(Value::as_object) {
        for (k, v) in data {
            write(k, v.as_str().unwrap_or("").as_bytes())?;
        }
    }
    if let Some(data) = obj.get("data").and_then(Value::as_object) {
        for (k, v) in data {
            let s = v.as_str().unwrap_or("");
            if plural == "secrets" {
                let bytes =
                    decode_base64(s).ok_or_else(|| format!("secret key {k} is not base64"))?;
                write(k, &bytes)?;
            } else {
                write(k, s.as_bytes())?;
            }
        }
    }
    if let Some(data) = obj.get("binaryData").and_then(Value::as_object) {
        for (k, v) in data {
            let bytes = decode_base64(v.as_str().unwrap_or(""))
                .ok_or_else(|| format!("binaryData key {k} is not base64"))?;
            write(k, &bytes)?;
        }
    }
    Ok(())
}

/// The node directory backing claim `claim` of `namespace`.
pub fn claim_dir(claims_root: &Path, namespace: &str, claim: &str) -> PathBuf {
    claims_root.join(namespace).join(claim)
}

/// The host directory of a mount: the volume's directory, or its `subPath`
/// inside it (created when missing, as the kubelet does). A `subPath` that
/// leaves the volume, also through a symlink planted in it, is refused.
pub fn sub_path(volume_dir: &Path, sub: Option<&str>) -> Result<PathBuf, String> {
    let Some(sub) = sub.filter(|s| !s.is_empty()) else {
        return Ok(volume_dir.to_owned());
    };
    if !crate::podcheck::sub_path_ok(sub) {
        return Err(format!("subPath {sub:?} must be relative without '..'"));
    }
    let dir = volume_dir.join(sub);
    std::fs::create_dir_all(&dir).map_err(|e| format!("failed to create subPath {sub:?}: {e}"))?;
    let (base, real) = (
        volume_dir
            .canonicalize()
            .map_err(|e| format!("volume directory: {e}"))?,
        dir.canonicalize()
            .map_err(|e| format!("subPath {sub:?}: {e}"))?,
    );
    if !real.starts_with(&base) {
        return Err(format!("subPath {sub:?} resolves outside of the volume"));
    }
    Ok(real)
}

/// Create the host directory of every volume; returns volume name → host path.
pub fn prepare(
    shared: &Lookup,
    pod: &Value,
    pod_dir: &Path,
    claims_root: &Path,
) -> Result<BTreeMap<String, PathBuf>, String> {
    let namespace = pod
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut out = BTreeMap::new();
    let volumes = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for v in volumes {
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let dir = pod_dir.join("volumes").join(&name);
        if let Some(host) = v.pointer("/hostPath/path").and_then(Value::as_str) {
            out.insert(name, PathBuf::from(host));
            continue;
        }
        if let Some(claim) = v
            .pointer("/persistentVolumeClaim/claimName")
            .and_then(Value::as_str)
        {
            let dir = claim_dir(claims_root, namespace, claim);
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("failed to provision claim {claim}: {e}"))?;
            out.insert(name, dir);
            continue;
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("failed to create volume {name}: {e}"))?;
        let optional = |p: &str| v.pointer(p).and_then(Value::as_bool).unwrap_or(false);
        if v.get("emptyDir").is_some() {
            // World-writable, as a node makes it: containers may run as any user.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
                .map_err(|e| format!("failed to create volume {name}: {e}"))?;
        } else if let Some(cm) = v.pointer("/configMap/name").and_then(Value::as_str) {
            project(
                shared,
                "configmaps",
                namespace,
                cm,
                optional("/configMap/optional"),
                &dir,
            )?;
        } else if let Some(secret) = v.pointer("/secret/secretName").and_then(Value::as_str) {
            project(
                shared,
                "secrets",
                namespace,
                secret,
                optional("/secret/optional"),
                &dir,
            )?;
        } else {
            return Err(format!(
                "volume {name}: only emptyDir, configMap, secret, hostPath and persistentVolumeClaim are supported by testkit"
            ));
        }
        out.insert(name, dir);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_paths_stay_inside_their_volume() {
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path().join("vol");
        std::fs::create_dir_all(&vol).unwrap();
        let made = sub_path(&vol, Some("runs/a/out")).unwrap();
        assert!(made.is_dir());
        assert!(made.ends_with("runs/a/out"));
        assert_eq!(sub_path(&vol, None).unwrap(), vol);
        assert!(sub_path(&vol, Some("../x")).is_err());
        assert!(sub_path(&vol, Some("/etc")).is_err());
        std::os::unix::fs::symlink(tmp.path(), vol.join("escape")).unwrap();
        assert!(sub_path(&vol, Some("escape/x")).is_err());
    }

    #[test]
    fn base64_decodes_padded_and_unpadded_input() {
        assert_eq!(decode_base64("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(decode_base64("aGVsbG8").unwrap(), b"hello");
        assert_eq!(decode_base64("aGk=").unwrap(), b"hi");
        assert!(decode_base64("!!").is_none());
    }
}
