//! The worker's on-disk spool of reports not yet acked by the leader.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use gnomon_proto::v1;

/// The on-disk spool: reports appended to segment files (`seg-N.log`,
/// records of `u32` length + protobuf), written but not fsynced. A segment is
/// deleted once every report in it is acked and a newer segment is being
/// written. After a restart every report still on disk is sent again; the
/// leader dedupes by `(run, attempt)`, so one acked just before the crash is
/// harmless. (One file per report cost an inode create and delete per
/// result: it capped a worker near 2,000 results a second.)
pub(crate) struct SegmentLog {
    dir: PathBuf,
    current: Option<(u64, std::fs::File, u64)>,
    next_id: u64,
    /// Unacked reports per segment, and each report's segment.
    pending: BTreeMap<u64, std::collections::HashSet<(String, u32)>>,
    segment_of: HashMap<(String, u32), u64>,
}

pub(crate) const SEGMENT_BYTES: u64 = 4 << 20;

impl SegmentLog {
    pub(crate) fn path(dir: &std::path::Path, id: u64) -> PathBuf {
        dir.join(format!("seg-{id:012}.log"))
    }

    pub(crate) fn open(dir: &std::path::Path) -> std::io::Result<(SegmentLog, Vec<v1::Report>)> {
        std::fs::create_dir_all(dir)?;
        let mut ids: Vec<u64> = std::fs::read_dir(dir)?
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_prefix("seg-")?.strip_suffix(".log")?.parse().ok()))
            .collect();
        ids.sort_unstable();
        let mut log = SegmentLog {
            dir: dir.to_path_buf(),
            current: None,
            next_id: ids.last().map_or(1, |l| l + 1),
            pending: BTreeMap::new(),
            segment_of: HashMap::new(),
        };
        let mut reports = Vec::new();
        for id in ids {
            let bytes = std::fs::read(Self::path(dir, id))?;
            let mut rest = bytes.as_slice();
            while rest.len() >= 4 {
                let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                if rest.len() < 4 + len {
                    break; // a torn last record
                }
                if let Ok(r) = <v1::Report as prost::Message>::decode(&rest[4..4 + len]) {
                    let key = (r.run_id.clone(), r.attempt);
                    log.pending.entry(id).or_default().insert(key.clone());
                    log.segment_of.insert(key, id);
                    reports.push(r);
                }
                rest = &rest[4 + len..];
            }
            if !log.pending.contains_key(&id) {
                let _ = std::fs::remove_file(Self::path(dir, id));
            }
        }
        Ok((log, reports))
    }

    pub(crate) fn append(&mut self, key: &(String, u32), report: &v1::Report) -> std::io::Result<()> {
        use std::io::Write;
        if self.current.as_ref().is_none_or(|(_, _, size)| *size >= SEGMENT_BYTES) {
            let id = self.next_id;
            self.next_id += 1;
            let file = std::fs::OpenOptions::new().create(true).append(true).open(Self::path(&self.dir, id))?;
            if let Some((old, _, _)) = self.current.replace((id, file, 0)) {
                if self.pending.get(&old).is_none_or(|p| p.is_empty()) {
                    self.pending.remove(&old);
                    let _ = std::fs::remove_file(Self::path(&self.dir, old));
                }
            }
        }
        let body = prost::Message::encode_to_vec(report);
        let mut record = Vec::with_capacity(4 + body.len());
        record.extend_from_slice(&(body.len() as u32).to_le_bytes());
        record.extend_from_slice(&body);
        let Some((id, file, size)) = self.current.as_mut() else { return Ok(()) };
        file.write_all(&record)?;
        *size += record.len() as u64;
        self.pending.entry(*id).or_default().insert(key.clone());
        self.segment_of.insert(key.clone(), *id);
        Ok(())
    }

    pub(crate) fn ack(&mut self, key: &(String, u32)) {
        let Some(id) = self.segment_of.remove(key) else { return };
        let empty = self.pending.get_mut(&id).is_some_and(|p| {
            p.remove(key);
            p.is_empty()
        });
        let is_current = self.current.as_ref().is_some_and(|(c, _, _)| *c == id);
        if empty && !is_current {
            self.pending.remove(&id);
            let _ = std::fs::remove_file(Self::path(&self.dir, id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(run: &str) -> v1::Report {
        v1::Report { run_id: run.into(), attempt: 1, outcome: v1::Outcome::Succeeded as i32, output: "x".repeat(100), ..Default::default() }
    }

    #[test]
    fn the_spool_keeps_unacked_reports_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, loaded) = SegmentLog::open(dir.path()).unwrap();
        assert!(loaded.is_empty());
        for i in 0..5 {
            log.append(&(format!("r{i}"), 1), &report(&format!("r{i}"))).unwrap();
        }
        log.ack(&("r1".into(), 1));
        log.ack(&("r3".into(), 1));
        drop(log);
        let (_, loaded) = SegmentLog::open(dir.path()).unwrap();
        let mut runs: Vec<String> = loaded.iter().map(|r| r.run_id.clone()).collect();
        runs.sort();
        // Acked reports in a live segment may come back (the leader dedupes);
        // unacked ones always do.
        for r in ["r0", "r2", "r4"] {
            assert!(runs.contains(&r.to_string()), "{r} survives: {runs:?}");
        }
    }

    #[test]
    fn fully_acked_segments_are_deleted_and_torn_records_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = SegmentLog::open(dir.path()).unwrap();
        log.append(&("a".into(), 1), &report("a")).unwrap();
        log.current.as_mut().unwrap().2 = SEGMENT_BYTES; // force a rotation
        log.append(&("b".into(), 1), &report("b")).unwrap();
        log.ack(&("a".into(), 1));
        let files = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(files, 1, "the acked, rotated segment is gone");
        drop(log);
        // A torn tail (a crash mid-write) is skipped.
        let seg = std::fs::read_dir(dir.path()).unwrap().next().unwrap().unwrap().path();
        let mut bytes = std::fs::read(&seg).unwrap();
        bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2]);
        std::fs::write(&seg, bytes).unwrap();
        let (_, loaded) = SegmentLog::open(dir.path()).unwrap();
        assert_eq!(loaded.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(), vec!["b"]);
    }
}
