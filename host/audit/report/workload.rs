//! What a workload is: `transfer_engine_bench`'s shape or one from the use (a paged KV cache's requests, whole or
//! layer by layer, store-style put/get), its name and the bytes it spans; sizes named in their largest whole unit.

use std::time::Duration;

/// One workload of the matrix: `transfer_engine_bench`'s shape (block size x batch size x threads), or one from
/// the use ([`Shape`]), for which `block_size` and `batch_size` say what one batch holds.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Workload {
    /// Bytes per request (a shape: its largest).
    pub block_size: u64,
    /// Requests per batch.
    pub batch_size: usize,
    /// Initiator threads.
    pub threads: usize,
    /// A workload from the use, laid out by its own rule; none: `transfer_engine_bench`'s layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Shape>,
}

impl Workload {
    /// `transfer_engine_bench`'s shape.
    pub fn bench(block_size: u64, batch_size: usize, threads: usize) -> Workload {
        Workload { block_size, batch_size, threads, shape: None }
    }

    /// One request's paged KV blocks per batch (see [`KvCache`]).
    pub fn kv_request(cache: KvCache) -> Workload {
        Workload {
            block_size: cache.block_bytes(),
            batch_size: cache.transfers_per_request(),
            threads: 1,
            shape: Some(Shape::KvRequest(cache)),
        }
    }

    /// One request's paged KV blocks layer by layer, `compute_us` of compute before each layer (see
    /// [`Shape::KvLayerwise`]).
    pub fn kv_layerwise(cache: KvCache, compute_us: u32) -> Workload {
        Workload {
            block_size: cache.block_bytes(),
            batch_size: 2 * cache.request_blocks as usize,
            threads: 1,
            shape: Some(Shape::KvLayerwise { cache, compute_us }),
        }
    }

    /// The compute a request of the workload waits for in all (layerwise workloads).
    pub fn compute_per_request(&self) -> Option<Duration> {
        match &self.shape {
            Some(Shape::KvLayerwise { cache, compute_us }) => {
                Some(Duration::from_micros(u64::from(*compute_us)) * cache.layers)
            }
            _ => None,
        }
    }

    /// Store-style put and get of `objects` objects (see [`Shape::Store`]).
    pub fn store(objects: usize, min_bytes: u64, max_bytes: u64, seed: u64) -> Workload {
        Workload {
            block_size: max_bytes,
            batch_size: objects,
            threads: 1,
            shape: Some(Shape::Store { objects, min_bytes, max_bytes, seed }),
        }
    }

    /// `4 KiB x 1 x 1 thread`, or the shape's description.
    pub fn name(&self) -> String {
        match &self.shape {
            None => format!(
                "{} x {} x {} thread{}",
                size_name(self.block_size),
                self.batch_size,
                self.threads,
                if self.threads == 1 { "" } else { "s" }
            ),
            Some(Shape::KvRequest(kv)) => format!(
                "KV request: {} layers x K/V x {} of {} blocks of {} ({} tokens x {} KV heads x {} x {} B), seed {}",
                kv.layers,
                kv.request_blocks,
                kv.cache_blocks,
                size_name(kv.block_bytes()),
                kv.tokens_per_block,
                kv.kv_heads,
                kv.head_dim,
                kv.dtype_bytes,
                kv.seed
            ),
            Some(Shape::KvLayerwise { cache: kv, compute_us }) => format!(
                "KV layerwise: {} layers of K/V x {} of {} blocks of {}, {compute_us} µs compute per layer, seed {}",
                kv.layers,
                kv.request_blocks,
                kv.cache_blocks,
                size_name(kv.block_bytes()),
                kv.seed
            ),
            Some(Shape::Store { objects, min_bytes, max_bytes, seed }) => format!(
                "store put/get: {objects} objects of {} to {}, seed {seed}",
                size_name(*min_bytes),
                size_name(*max_bytes)
            ),
        }
    }

    /// Bytes each buffer must hold for the workload.
    pub fn span(&self) -> u64 {
        match &self.shape {
            None => self.block_size.saturating_mul(self.batch_size as u64).saturating_mul(self.threads as u64),
            Some(Shape::KvRequest(kv)) | Some(Shape::KvLayerwise { cache: kv, .. }) => kv.cache_bytes(),
            Some(Shape::Store { objects, max_bytes, .. }) => max_bytes.saturating_mul(*objects as u64),
        }
    }
}

/// A workload from the use.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Shape {
    /// A vLLM-style paged KV cache on both sides; each batch moves one request's blocks (every layer's K and V
    /// block of each) from non-contiguous block ids of one cache to non-contiguous ids of the other, as one batched
    /// transfer: the P2P connector's shape.
    KvRequest(KvCache),
    /// The same cache and requests moved layer by layer, as the layerwise connector saves them during prefill: per
    /// layer `compute_us` of compute (the Host thread waits, as for the device), then that layer's K and V blocks as
    /// one batch of WRITEs, not waited for, so that it overlaps the next layers' compute; the request ends when every
    /// layer's batch has. The audit's operation does not apply.
    KvLayerwise { cache: KvCache, compute_us: u32 },
    /// Store-style put (WRITE) then get (READ) of many small objects of sizes drawn from the powers of two between
    /// `min_bytes` and `max_bytes`, one batch each way; the audit's operation does not apply.
    Store { objects: usize, min_bytes: u64, max_bytes: u64, seed: u64 },
}

/// A paged KV cache: `layers` x {K, V} x `cache_blocks` blocks of `tokens_per_block x kv_heads x head_dim x
/// dtype_bytes` bytes, laid out layer-major (`((layer x 2 + kv) x cache_blocks + block) x block_bytes`); a request
/// holds `request_blocks` blocks, their ids drawn without repeats from a seeded generator (ChaCha8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KvCache {
    pub layers: u32,
    pub tokens_per_block: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub dtype_bytes: u32,
    pub cache_blocks: u32,
    pub request_blocks: u32,
    pub seed: u64,
}

impl KvCache {
    /// Bytes of one K or V block of one layer.
    pub fn block_bytes(&self) -> u64 {
        u64::from(self.tokens_per_block)
            * u64::from(self.kv_heads)
            * u64::from(self.head_dim)
            * u64::from(self.dtype_bytes)
    }

    /// Bytes of the whole cache.
    pub fn cache_bytes(&self) -> u64 {
        u64::from(self.layers) * 2 * u64::from(self.cache_blocks) * self.block_bytes()
    }

    /// Transfers of one request: every layer's K and V block of each of its blocks.
    pub fn transfers_per_request(&self) -> usize {
        self.layers as usize * 2 * self.request_blocks as usize
    }
}

/// `4 KiB`, `16 MiB`, `1000 B`.
pub fn size_name(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in UNITS {
        if bytes >= size && bytes % size == 0 {
            return format!("{} {name}", bytes / size);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_named_in_the_largest_whole_unit() {
        assert_eq!(size_name(4096), "4 KiB");
        assert_eq!(size_name(16 << 20), "16 MiB");
        assert_eq!(size_name(1000), "1000 B");
        assert_eq!(size_name(3 << 29), "1536 MiB");
    }
}
