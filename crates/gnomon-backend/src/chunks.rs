//! Splitting a batch of writes into pieces a store accepts: at most so
//! many items and so many bytes each (an etcd txn, a SQL statement, a Raft
//! entry).

use gnomon_core::deps::RunAfter;

/// `items` in order, in slices of at most `max_items` items and
/// `max_bytes` bytes (`size(item)` is an item's); an item larger than
/// `max_bytes` alone goes alone. Empty items give no slice.
pub(crate) fn by_size<T>(items: &[T], max_items: usize, max_bytes: usize, size: impl Fn(&T) -> usize) -> Vec<&[T]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, item) in items.iter().enumerate() {
        let b = size(item);
        if i > start && (i - start >= max_items || bytes + b > max_bytes) {
            out.push(&items[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += b;
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
}

/// At most how long `text` is as the contents of a JSON string.
pub(crate) fn json_len(text: Option<&str>) -> usize {
    text.map_or(0, |t| {
        t.bytes()
            .map(|b| {
                if b < 0x20 {
                    6
                } else if b == b'"' || b == b'\\' {
                    2
                } else {
                    1
                }
            })
            .sum()
    })
}

/// At most how many bytes a new run adds to a request: its record (with
/// its params, payload and reason) and its index keys.
pub(crate) fn new_run_bytes(r: &crate::NewRun) -> usize {
    1024 + json_len(r.params.as_deref())
        + json_len(r.payload.as_deref())
        + json_len(r.upstream.as_deref().map(RunAfter::to_json).as_deref())
        + json_len(r.reason.as_deref())
        + json_len(r.key.as_deref())
}

/// At most how many bytes a transition adds to a request (not counting the
/// run record a store may rewrite with it): its reason, an ended attempt's
/// output and its notifications.
pub(crate) fn transition_bytes(t: &crate::Transition) -> usize {
    let output = match &t.attempt {
        Some(crate::AttemptChange::End { output, .. }) => json_len(Some(output)),
        _ => 0,
    };
    1024 + json_len(t.reason.as_deref()) + output + 1024 * t.notify.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_keep_order_and_stay_under_both_bounds() {
        let items: Vec<usize> = (0..1200).collect();
        let lens: Vec<usize> = by_size(&items, 500, 1 << 20, |_| 10).iter().map(|c| c.len()).collect();
        assert_eq!(lens, [500, 500, 200]);
        assert_eq!(by_size(&items[..5], 500, 8, |_| 3), [&[0, 1][..], &[2, 3], &[4]]);
        assert_eq!(by_size(&items[..2], 500, 8, |i| if *i == 0 { 100 } else { 1 }), [&[0][..], &[1]]);
        assert!(by_size::<usize>(&[], 500, 8, |_| 1).is_empty());
    }

    #[test]
    fn json_lengths_bound_the_escaped_text() {
        for text in ["plain", "quo\"te", "back\\slash", "new\nline\u{1}", "caf\u{e9} \u{1f600}"] {
            let escaped = serde_json::to_string(text).unwrap();
            assert!(json_len(Some(text)) >= escaped.len() - 2, "{text:?}");
        }
        assert_eq!(json_len(None), 0);
    }
}
