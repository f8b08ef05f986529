//! LRU against an independent stack-distance computation (Mattson et al., 1970): an access
//! with stack distance d (the number of distinct blocks touched since the block's previous
//! access, plus one) hits in every LRU cache of at least d blocks. One pass over the trace
//! gives the hit count of every size at once; LRU must match it at each size.

use strata_policy::{build, Params};
use strata_sim::sim::{replay, BlockAccess};
use strata_sim::synthetic::{Generator, Pattern};

/// Stack distances by brute force over an explicit recency stack (kept simple on purpose:
/// it shares no code or idea with the policy's linked lists and hash map).
fn hits_by_size(trace: &[u64], max_size: usize) -> Vec<u64> {
    let mut stack: Vec<u64> = Vec::new(); // most recent last
    let mut hist = vec![0u64; max_size + 2];
    for &b in trace {
        if let Some(pos) = stack.iter().rposition(|&x| x == b) {
            let d = stack.len() - pos; // 1 = most recent
            hist[d.min(max_size + 1)] += 1;
            stack.remove(pos);
        }
        stack.push(b);
    }
    // hits(c) = number of accesses with distance <= c
    let mut out = vec![0u64; max_size + 1];
    let mut acc = 0;
    for c in 1..=max_size {
        acc += hist[c];
        out[c] = acc;
    }
    out
}

fn accesses(blocks: &[u64]) -> Vec<BlockAccess> {
    blocks
        .iter()
        .map(|&block| BlockAccess { block, time_ns: 0, bytes: 4096, op: strata_policy::Op::Read, full: true })
        .collect()
}

#[test]
fn lru_matches_stack_distances_at_every_size() {
    let traces: Vec<(&str, Vec<u64>)> = vec![
        ("zipf:0.9", Generator::new(&Pattern::Zipf(0.9), 400, 1).take(12_000).collect()),
        ("uniform", Generator::new(&Pattern::Uniform, 300, 2).take(8_000).collect()),
        ("scanmix", Generator::new(&Pattern::ScanMix(1.1, 0.3), 200, 3).take(8_000).collect()),
    ];
    for (name, trace) in traces {
        let footprint = trace.iter().collect::<std::collections::HashSet<_>>().len();
        let expect = hits_by_size(&trace, footprint);
        let acc = accesses(&trace);
        for (size, &want) in expect.iter().enumerate().skip(1) {
            let mut lru = build("lru", size, &Params::default()).unwrap();
            let got = replay(lru.as_mut(), &acc, 0, None).hits;
            assert_eq!(got, want, "{name}: LRU with {size} blocks");
        }
    }
}
