//! A small order-preserving parallel map for the large-store paths of
//! `check` (reading and decoding thousands of record files). Work is handed
//! out in small chunks from a shared counter, so a thread that the machine
//! runs slower (other load on the cores) simply takes fewer chunks instead of
//! holding everyone up at the join.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Items per chunk handed to a worker.
const CHUNK: usize = 64;

/// `items.iter().map(f).collect()`, on up to `max_threads` threads when
/// there are at least `min_parallel` items. Results keep the input order.
/// A panic in `f` is re-raised on the calling thread.
pub fn map<T, R, F>(items: &[T], min_parallel: usize, max_threads: usize, f: F) -> Vec<R>
where
    T: Sync,
    R: Send,
    F: Fn(&T) -> R + Sync,
{
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(max_threads);
    if items.len() < min_parallel.max(2) || threads < 2 {
        return items.iter().map(f).collect();
    }
    let chunks = items.len().div_ceil(CHUNK);
    let next = AtomicUsize::new(0);
    let mut parts: Vec<(usize, Vec<R>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads.min(chunks))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let c = next.fetch_add(1, Ordering::Relaxed);
                        let start = c.saturating_mul(CHUNK);
                        let Some(part) = items.get(start..items.len().min(start + CHUNK)) else {
                            break;
                        };
                        if part.is_empty() {
                            break;
                        }
                        done.push((c, part.iter().map(&f).collect::<Vec<R>>()));
                    }
                    done
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    parts.sort_unstable_by_key(|(c, _)| *c);
    parts.into_iter().flat_map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_at_every_size() {
        for n in [0usize, 1, 63, 64, 65, 500, 4097] {
            let items: Vec<usize> = (0..n).collect();
            let doubled = map(&items, 2, 8, |x| x * 2);
            assert_eq!(doubled, items.iter().map(|x| x * 2).collect::<Vec<_>>());
        }
    }
}
