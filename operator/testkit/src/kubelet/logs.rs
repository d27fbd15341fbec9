//! Container logs for the `pods/log` subresource: the last N lines, or a
//! followed stream that ends when the container terminates or the pod goes.

use std::{
    io::{Read, Seek, SeekFrom},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::{
    body::{BodyError, ResponseBody},
    server::Shared,
    store::ObjectKey,
};

/// How often a followed log checks the file for new bytes.
const POLL: Duration = Duration::from_millis(25);

/// The last `lines` lines of `text` (all of it when `None`).
pub fn tail(text: &str, lines: Option<usize>) -> String {
    let Some(n) = lines else {
        return text.to_owned();
    };
    let all: Vec<&str> = text.split_inclusive('\n').collect();
    all[all.len().saturating_sub(n)..].concat()
}

fn terminated(shared: &Shared, key: &ObjectKey, container: &str) -> bool {
    let state = shared.lock();
    let Some(pod) = state.object(key) else {
        return true;
    };
    ["containerStatuses", "initContainerStatuses"]
        .iter()
        .any(|list| {
            pod.pointer(&format!("/status/{list}"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|c| {
                    c.get("name").and_then(Value::as_str) == Some(container)
                        && c.pointer("/state/terminated").is_some()
                })
        })
}

fn read_from(path: &PathBuf, offset: u64) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path)
        && f.seek(SeekFrom::Start(offset)).is_ok()
    {
        let _ = f.read_to_end(&mut buf);
    }
    buf
}

/// Stream a container's log as it grows, until the container terminates.
pub fn follow(
    shared: Arc<Shared>,
    namespace: String,
    pod: String,
    container: String,
    path: PathBuf,
) -> ResponseBody {
    let (tx, rx) = mpsc::channel::<Result<Bytes, BodyError>>(64);
    let key = ObjectKey {
        group: String::new(),
        plural: "pods".to_owned(),
        namespace,
        name: pod,
    };
    tokio::spawn(async move {
        let mut offset = 0u64;
        loop {
            // Check before reading so the last bytes written before exit are sent.
            let done = terminated(&shared, &key, &container);
            let chunk = read_from(&path, offset);
            if !chunk.is_empty() {
                offset += chunk.len() as u64;
                if tx.send(Ok(Bytes::from(chunk))).await.is_err() {
                    return;
                }
            }
            if done {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                () = tx.closed() => return,
            }
        }
    });
    ResponseBody::stream(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", Some(2)), "b\nc\n");
        assert_eq!(tail("a\nb", Some(1)), "b");
        assert_eq!(tail("a\n", None), "a\n");
        assert_eq!(tail("a\n", Some(5)), "a\n");
    }
}
