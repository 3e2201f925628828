//! Reads Prometheus text-format metrics over plain HTTP/1.0: enough to
//! scrape a counter or two from a node on loopback without an HTTP client
//! stack.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest metrics page read; etcd's is a few hundred KB.
const MAX_METRICS_BYTES: usize = 8 << 20;
/// How long one scrape may take.
const SCRAPE_TIMEOUT_MS: u64 = 3_000;

/// The body of `GET url` (`http://host:port/path`), or `None` on any error.
pub async fn get(url: &str) -> Option<String> {
    let rest = url.strip_prefix("http://")?;
    let (host, path) = match rest.split_once('/') {
        Some((h, p)) => (h, format!("/{p}")),
        None => (rest, "/".to_owned()),
    };
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nAccept: text/plain\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut body = Vec::new();
        stream
            .take(MAX_METRICS_BYTES as u64)
            .read_to_end(&mut body)
            .await
            .ok()?;
        let text = String::from_utf8_lossy(&body).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.")
            .then_some(())
            .filter(|()| head.split(' ').nth(1) == Some("200"))?;
        Some(body.to_owned())
    };
    tokio::time::timeout(Duration::from_millis(SCRAPE_TIMEOUT_MS), fetch)
        .await
        .ok()
        .flatten()
}

/// The sum of every sample of metric `name` (all label sets) in a
/// Prometheus text page, or `None` if it has none.
pub fn sum_metric(page: &str, name: &str) -> Option<f64> {
    let mut total = None;
    for line in page.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        // The name must end here: `foo_count` is not `foo`.
        let rest = match rest.chars().next() {
            Some('{') => rest.split_once('}').map(|(_, v)| v)?,
            Some(' ') => rest,
            _ => continue,
        };
        if let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            *total.get_or_insert(0.0) += value;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_label_set_of_exactly_the_named_metric() {
        let page = "# HELP x\n\
                    fsyncs_total{node=\"1\"} 10\n\
                    fsyncs_total{node=\"2\"} 5\n\
                    fsyncs_total_seconds 99\n\
                    other 1\n";
        assert_eq!(sum_metric(page, "fsyncs_total"), Some(15.0));
        assert_eq!(sum_metric(page, "other"), Some(1.0));
        assert_eq!(sum_metric(page, "missing"), None);
    }
}
