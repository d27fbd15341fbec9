//! A bare HTTP/1.1 GET for the admin endpoints of `protobot operator` processes (shared by
//! the operator tests through `#[path]`).

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` on `addr`: the status and the body, or `None` when the server does not answer.
pub async fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await.ok()?;
    let mut buf = String::new();
    stream.read_to_string(&mut buf).await.ok()?;
    let status = buf.split_whitespace().nth(1)?.parse().ok()?;
    Some((
        status,
        buf.split("\r\n\r\n").nth(1).unwrap_or("").to_string(),
    ))
}
