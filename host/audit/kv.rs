//! The request lists of the workloads from the use ([`Shape`]): which bytes each batch moves, drawn before the
//! clock starts from a seeded generator, so that every path moves the same requests.

use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::report::{KvCache, Shape};
use crate::transfer::{Opcode, Protocol, SegmentId, TransferRequest};

/// How many different batches a shaped workload cycles through.
pub const BATCHES: usize = 16;

/// Where a workload's requests go.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub protocol: Protocol,
    pub segment: SegmentId,
    pub local_base: u64,
    pub remote_base: u64,
}

/// The batches of one thread of `shape` (the shaped workloads run one thread).
pub fn batches(shape: &Shape, operation: Opcode, target: Target) -> Vec<Vec<TransferRequest>> {
    let request = |opcode: Opcode, local: u64, remote: u64, length: u64| TransferRequest {
        opcode,
        source: target.local_base + local,
        target_id: target.segment,
        target_offset: target.remote_base + remote,
        length,
        protocol: Some(target.protocol),
    };
    match shape {
        Shape::KvRequest(kv) => {
            let mut rng = ChaCha8Rng::seed_from_u64(kv.seed);
            (0..BATCHES)
                .map(|_| {
                    let (remote, local) = (block_ids(kv, &mut rng), block_ids(kv, &mut rng));
                    let mut batch = Vec::with_capacity(kv.transfers_per_request());
                    for layer in 0..kv.layers {
                        for half in 0..2 {
                            for (&r, &l) in remote.iter().zip(&local) {
                                let at = |block: u32| kv_offset(kv, layer, half, block);
                                batch.push(request(operation, at(l), at(r), kv.block_bytes()));
                            }
                        }
                    }
                    batch
                })
                .collect()
        }
        Shape::KvLayerwise { cache, .. } => layerwise(cache, target).into_iter().flatten().collect(),
        Shape::Store { objects, min_bytes, max_bytes, seed } => {
            let mut rng = ChaCha8Rng::seed_from_u64(*seed);
            let sizes: Vec<u64> = (*min_bytes..=*max_bytes).filter(|s| s.is_power_of_two()).collect();
            let sizes = if sizes.is_empty() { vec![*max_bytes] } else { sizes };
            // Object i lives at i x max_bytes on both sides, with its drawn size.
            let lengths: Vec<u64> = (0..*objects).map(|_| sizes[rng.gen_range(0..sizes.len())]).collect();
            (0..BATCHES)
                .map(|batch| {
                    let opcode = if batch % 2 == 0 { Opcode::Write } else { Opcode::Read };
                    let order = sample(&mut rng, *objects, *objects);
                    order
                        .iter()
                        .map(|i| request(opcode, i as u64 * max_bytes, i as u64 * max_bytes, lengths[i]))
                        .collect()
                })
                .collect()
        }
    }
}

/// The requests of a layerwise workload: the KV requests of `cache` (as [`batches`] draws them), each split by layer
/// into its layers' K and V transfers, all WRITEs.
pub fn layerwise(cache: &KvCache, target: Target) -> Vec<Vec<Vec<TransferRequest>>> {
    let per_layer = 2 * cache.request_blocks.min(cache.cache_blocks) as usize;
    batches(&Shape::KvRequest(*cache), Opcode::Write, target)
        .into_iter()
        .map(|request| request.chunks(per_layer).map(<[TransferRequest]>::to_vec).collect())
        .collect()
}

/// `request_blocks` distinct block ids of the cache, in drawn order.
fn block_ids(kv: &KvCache, rng: &mut ChaCha8Rng) -> Vec<u32> {
    let count = kv.request_blocks.min(kv.cache_blocks) as usize;
    sample(rng, kv.cache_blocks as usize, count).iter().map(|id| id as u32).collect()
}

/// Byte offset of `layer`'s K (`half` 0) or V (1) block `block` in the cache.
pub fn kv_offset(kv: &KvCache, layer: u32, half: u32, block: u32) -> u64 {
    ((u64::from(layer) * 2 + u64::from(half)) * u64::from(kv.cache_blocks) + u64::from(block)) * kv.block_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(seed: u64) -> KvCache {
        KvCache {
            layers: 3,
            tokens_per_block: 16,
            kv_heads: 2,
            head_dim: 64,
            dtype_bytes: 2,
            cache_blocks: 20,
            request_blocks: 5,
            seed,
        }
    }

    fn target() -> Target {
        Target { protocol: Protocol::Aiv, segment: SegmentId::LOCAL, local_base: 1 << 20, remote_base: 1 << 30 }
    }

    #[test]
    fn a_kv_request_moves_every_layer_s_k_and_v_of_distinct_blocks_inside_both_caches() {
        let kv = cache(7);
        let batches = batches(&Shape::KvRequest(kv), Opcode::Read, target());
        assert_eq!(batches.len(), BATCHES);
        let block = kv.block_bytes();
        assert_eq!(block, 4096);
        for batch in &batches {
            assert_eq!(batch.len(), 3 * 2 * 5);
            let mut remote: Vec<u64> = batch.iter().map(|r| r.target_offset - (1 << 30)).collect();
            let mut local: Vec<u64> = batch.iter().map(|r| r.source - (1 << 20)).collect();
            for offsets in [&mut remote, &mut local] {
                assert!(offsets.iter().all(|o| o % block == 0 && o + block <= kv.cache_bytes()));
                offsets.sort_unstable();
                offsets.dedup();
                assert_eq!(offsets.len(), 30, "every block of the request, K and V of every layer, once");
            }
            assert!(batch.iter().all(|r| r.opcode == Opcode::Read && r.length == block));
        }
        // Non-contiguous and reproducible: the same seed draws the same requests, another seed others.
        assert_eq!(batches, super::batches(&Shape::KvRequest(kv), Opcode::Read, target()));
        assert_ne!(batches, super::batches(&Shape::KvRequest(cache(8)), Opcode::Read, target()));
        let first: Vec<u64> = batches[0][..5].iter().map(|r| r.target_offset).collect();
        assert!(first.windows(2).any(|w| w[1] != w[0] + block), "ids drawn, not a contiguous run: {first:?}");
        assert_eq!(kv_offset(&kv, 1, 1, 2), ((2 + 1) * 20 + 2) * 4096);
    }

    #[test]
    fn a_layerwise_request_is_the_kv_request_split_by_layer_into_writes() {
        let kv = cache(7);
        let requests = layerwise(&kv, target());
        let whole = batches(&Shape::KvRequest(kv), Opcode::Read, target());
        assert_eq!(requests.len(), BATCHES);
        for (layers, request) in requests.iter().zip(&whole) {
            assert_eq!(layers.len(), 3, "one batch per layer");
            assert!(layers.iter().all(|layer| layer.len() == 2 * 5 && layer.iter().all(|r| r.opcode == Opcode::Write)));
            let flat: Vec<(u64, u64)> = layers.iter().flatten().map(|r| (r.source, r.target_offset)).collect();
            let same: Vec<(u64, u64)> = request.iter().map(|r| (r.source, r.target_offset)).collect();
            assert_eq!(flat, same, "the same blocks as the whole request, in layer order");
            // Layer l's transfers are layer l's K and V blocks.
            for (l, layer) in layers.iter().enumerate() {
                let span = 2 * u64::from(kv.cache_blocks) * kv.block_bytes();
                assert!(layer.iter().all(|r| (r.target_offset - (1 << 30)) / span == l as u64));
            }
        }
    }

    #[test]
    fn a_store_workload_puts_then_gets_disjoint_objects_of_power_of_two_sizes() {
        let shape = Shape::Store { objects: 12, min_bytes: 1024, max_bytes: 8192, seed: 3 };
        let batches = batches(&shape, Opcode::Read, target());
        assert_eq!(batches.len(), BATCHES);
        for (i, batch) in batches.iter().enumerate() {
            assert_eq!(batch.len(), 12);
            let expected = if i % 2 == 0 { Opcode::Write } else { Opcode::Read };
            assert!(batch.iter().all(|r| r.opcode == expected));
            assert!(batch.iter().all(|r| r.length.is_power_of_two() && (1024..=8192).contains(&r.length)));
            let mut slots: Vec<u64> = batch.iter().map(|r| (r.source - (1 << 20)) / 8192).collect();
            slots.sort_unstable();
            assert_eq!(slots, (0..12).collect::<Vec<u64>>(), "each object once, in its own slot");
        }
        // An object keeps its size between its put and its get.
        let size = |batch: &Vec<TransferRequest>, slot: u64| {
            batch.iter().find(|r| r.source == (1 << 20) + slot * 8192).map(|r| r.length)
        };
        assert!((0..12).all(|slot| size(&batches[0], slot) == size(&batches[1], slot)));
    }
}
