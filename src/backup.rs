//! `warden admin backup` and `warden admin restore` (docs/design/backup-restore.md).
//!
//! A backup is a file of frames (`BackupFrame` in `placement.proto`): a manifest (placement's
//! state: the routing table, quotas, limits, ACL), each group's pages as its nodes stream
//! them (`Placement.BackupGroup`: one consistent image per group, writes going on), and an
//! end frame with the SHA-256 of everything before it. It is written to `FILE.partial` and
//! renamed once complete, so a file named FILE is always a whole backup.
//!
//! A backup waits (up to [`MOVE_WAIT`]) until no subtree moves, and is refused if one moved
//! while it read: each image is of its group as it served its paths then, so the images fit
//! together only if no path changed groups between them. The file is checked before it is
//! named: the groups' descriptors at their images partition the namespace and each record
//! lies in its own group's, so every path is in it exactly once.
//!
//! A restore reads the whole file once to check it, then gives a fresh cluster placement's
//! state (limits, quotas, ACL), a group for every prefix the backup has, and each group's
//! pages through the log (`Placement.RestorePage`), under an id derived from the file's
//! SHA-256: a run of the same file again recognises what an interrupted run restored.

use std::collections::BTreeMap;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use prost::Message as _;
use warden_namespace::descriptor;
use warden_namespace::store::{parse_subtree_key, SubtreeKey};
use warden_placement::{is_at_or_below, is_strictly_below};
use warden_proto::placement::backup_frame::Frame;
use warden_proto::placement::*;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::GroupDescriptor;

use crate::admin::{at_any_answer, at_any_within, create_group, routing_table};

/// The file format this binary writes and reads.
const FORMAT: u32 = 1;
/// Largest frame a restore reads (a page is at most 1 MiB of records, plus framing).
const FRAME_BYTES_MAX: usize = 8 << 20;
/// Bytes of records per page asked of the nodes.
const PAGE_BYTES: u32 = 1 << 20;
/// How long one call (a page, a group's stream start) may keep failing over before the
/// backup or restore gives up.
const CALL_PATIENCE: Duration = Duration::from_secs(30);
/// How long a group may take to delete an unfinished restore's records before a new
/// restore gives up on it (a page of records per round trip of its log).
const DISCARD_PATIENCE: Duration = Duration::from_secs(600);
/// Attempts at one group's image (a replica may go away mid-stream).
const GROUP_ATTEMPTS_MAX: usize = 5;
/// Longest a backup (or a restore) waits for a subtree move in the cluster — a split, a
/// merge, a group's creation — to end before it starts; a move that takes longer refuses it.
const MOVE_WAIT: Duration = Duration::from_secs(60);

/// What a backup or a restore did, per group.
#[derive(Debug, Default)]
pub struct Summary {
    /// Per prefix: the group's id (in the backup), its revision in the image, its records.
    pub groups: BTreeMap<String, (u64, u64, u64)>,
    /// Bytes of the file.
    pub bytes: u64,
}

impl Summary {
    /// One line per group and a total, for people.
    pub fn text(&self, verb: &str) -> String {
        let mut text = String::new();
        for (prefix, (group, revision, records)) in &self.groups {
            text.push_str(&format!("{prefix}\tgroup {group}\trevision {revision}\t{records} records\n"));
        }
        let records: u64 = self.groups.values().map(|(_, _, records)| records).sum();
        text.push_str(&format!("{verb} {} groups, {records} records, {} bytes", self.groups.len(), self.bytes));
        text
    }

    /// The same as JSON.
    pub fn json(&self) -> serde_json::Value {
        let groups: Vec<_> = self
            .groups
            .iter()
            .map(|(prefix, (group, revision, records))| serde_json::json!({"prefix": prefix, "group": group, "revision": revision, "records": records}))
            .collect();
        serde_json::json!({ "groups": groups, "bytes": self.bytes })
    }
}

/// Writes frames to a file, each a big-endian u32 length and the frame.
struct FrameWriter {
    file: std::io::BufWriter<std::fs::File>,
    offset: u64,
}

impl FrameWriter {
    fn write(&mut self, frame: Frame) -> anyhow::Result<()> {
        let bytes = BackupFrame { frame: Some(frame) }.encode_to_vec();
        let length = u32::try_from(bytes.len()).context("a frame past 4 GiB")?;
        self.file.write_all(&length.to_be_bytes())?;
        self.file.write_all(&bytes)?;
        self.offset += 4 + bytes.len() as u64;
        Ok(())
    }

    /// Drops what was written past `offset` (a group's pages, to read them again).
    fn truncate(&mut self, offset: u64) -> anyhow::Result<()> {
        self.file.flush()?;
        let file = self.file.get_mut();
        file.set_len(offset)?;
        file.seek(std::io::SeekFrom::Start(offset))?;
        self.offset = offset;
        Ok(())
    }
}

/// The groups a backup reads: every group serving a prefix (not retired).
fn serving_groups(table: &RoutingTable) -> BTreeMap<u64, String> {
    table.groups.iter().filter(|g| !g.retired).filter_map(|g| g.descriptor.as_ref()).map(|d| (d.group_id, d.prefix.clone())).collect()
}

/// A subtree move `table` shows in flight, for people: a group not ready yet (being created
/// or split off) or merging into another. `None` when every group is settled.
fn move_in_flight(table: &RoutingTable) -> Option<String> {
    table.groups.iter().filter(|g| !g.retired).find_map(|g| {
        let d = g.descriptor.as_ref()?;
        match (g.merging_into, g.ready) {
            (0, true) => None,
            (0, false) => Some(format!("group {} ({}) is being created or split off", d.group_id, d.prefix)),
            (into, _) => Some(format!("group {} ({}) is merging into group {into}", d.group_id, d.prefix)),
        }
    })
}

/// The routing table once no subtree moves in it, waiting for its changes up to `wait`;
/// refused, naming the move, if one is still in flight then.
async fn settled_table(seeds: &[String], wait: Duration) -> anyhow::Result<RoutingTable> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut table = routing_table(seeds, CALL_PATIENCE).await?;
    loop {
        let Some(moving) = move_in_flight(&table) else { return Ok(table) };
        let after_version = table.version;
        let mut tables =
            at_any_within(seeds, CALL_PATIENCE, |mut c| async move { c.watch_routing_table(WatchRoutingTableRequest { after_version }).await })
                .await?;
        match tokio::time::timeout_at(deadline, tables.message()).await {
            Ok(Ok(Some(next))) => table = next,
            // The stream ended (its node is stopping): read the table again.
            Ok(Ok(None)) => table = routing_table(seeds, CALL_PATIENCE).await?,
            Ok(Err(status)) => anyhow::bail!("watching the routing table for {moving}: {}", status.message()),
            Err(_) => {
                anyhow::bail!("{moving}, still after {wait:?}: a subtree moving refuses a backup or restore (run it again once the move is done)")
            }
        }
    }
}

/// Who serves what, per group placement has (retired ones serve nothing): its prefix, the
/// subtrees carved out of it, its descriptor's version (which grows with every change of
/// what it serves) and its state. Replicas and `conf_ver` are not in it: moving a replica
/// changes no path's group, and the balance schedulers move replicas at any time.
type Ownership = BTreeMap<u64, (String, Vec<String>, u64, bool, u64)>;

fn ownership(table: &RoutingTable) -> Ownership {
    let groups = table.groups.iter().filter(|g| !g.retired);
    groups
        .filter_map(|g| g.descriptor.as_ref().map(|d| (d.group_id, (d.prefix.clone(), d.excluded.clone(), d.version, g.ready, g.merging_into))))
        .collect()
}

/// The first difference between `before` and `after`, for people.
fn ownership_change(before: &Ownership, after: &Ownership) -> Option<String> {
    let ids: std::collections::BTreeSet<&u64> = before.keys().chain(after.keys()).collect();
    ids.into_iter().find_map(|id| match (before.get(id), after.get(id)) {
        (Some(old), Some(new)) if old == new => None,
        (Some(old), Some(new)) => {
            Some(format!("group {id} ({}) changed: version {} to {}, without {:?} to without {:?}", old.0, old.2, new.2, old.1, new.1))
        }
        (Some(old), None) => Some(format!("group {id} ({}) was merged away", old.0)),
        (None, Some(new)) => Some(format!("group {id} ({}) was created or split off", new.0)),
        (None, None) => None,
    })
}

/// The addresses of `group`'s replicas in `table`.
fn replica_addrs(table: &RoutingTable, group: u64) -> Vec<String> {
    let replicas = table.groups.iter().filter_map(|g| g.descriptor.as_ref()).find(|d| d.group_id == group).map(|d| d.replicas.clone());
    let addr = |id: &u64| table.nodes.iter().find(|n| n.id == *id).map(|n| n.addr.clone());
    replicas.unwrap_or_default().iter().filter_map(addr).collect()
}

/// Backs up every group of the cluster `seeds` reach into `out` (see the module's doc).
pub async fn backup(seeds: &[String], out: &Path) -> anyhow::Result<Summary> {
    let table = settled_table(seeds, MOVE_WAIT).await?;
    let quotas = at_any_within(seeds, CALL_PATIENCE, |mut c| async move { c.list_quotas(ListQuotasRequest {}).await }).await?;
    let limits = at_any_within(seeds, CALL_PATIENCE, |mut c| async move { c.get_limits(GetLimitsRequest {}).await }).await?;
    let groups = serving_groups(&table);
    let created_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let partial = partial_path(out);
    let file = std::fs::File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let mut writer = FrameWriter { file: std::io::BufWriter::new(file), offset: 0 };
    let acl = table.acl.clone();
    writer.write(Frame::Manifest(BackupManifest {
        format: FORMAT,
        created_ms,
        table: Some(table.clone()),
        quotas: Some(quotas),
        limits: Some(limits),
        acl,
    }))?;
    let mut summary = Summary::default();
    for (group, prefix) in &groups {
        let (revision, records) = backup_group(&table, *group, &mut writer).await.with_context(|| format!("backing up group {group} ({prefix})"))?;
        summary.groups.insert(prefix.clone(), (*group, revision, records));
    }
    // Each image is of its group as it served then; if a subtree moved meanwhile, it may be
    // in two images or none.
    if let Some(change) = ownership_change(&ownership(&table), &ownership(&routing_table(seeds, CALL_PATIENCE).await?)) {
        anyhow::bail!("{change} during the backup, so a subtree could be in two of its images or none: run it again");
    }
    writer.file.flush()?;
    let sha256 = file_sha256(&partial)?;
    let records = summary.groups.values().map(|(_, _, records)| records).sum();
    writer.write(Frame::End(BackupEnd { groups: groups.len() as u64, records, sha256 }))?;
    let file = writer.file.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    summary.bytes = writer.offset;
    // Belt and braces: the images fit together, each path once.
    check(&partial, &[]).context("the backup's images do not fit together (a subtree moved while it was read): run it again")?;
    std::fs::rename(&partial, out).with_context(|| format!("renaming {} to {}", partial.display(), out.display()))?;
    Ok(summary)
}

/// Streams one group's image into `writer`, from one of its replicas (again from another if
/// one fails mid-stream). Answers the image's revision and its records.
async fn backup_group(table: &RoutingTable, group: u64, writer: &mut FrameWriter) -> anyhow::Result<(u64, u64)> {
    let addrs = replica_addrs(table, group);
    let start = writer.offset;
    let mut attempt = 0;
    loop {
        attempt += 1;
        writer.truncate(start)?;
        let request = BackupGroupRequest { group_id: group, page_bytes_max: PAGE_BYTES };
        let outcome = async {
            let mut stream = at_any_within(&addrs, CALL_PATIENCE, |mut c| async move { c.backup_group(request).await }).await?;
            let (mut revision, mut records) = (None, 0u64);
            while let Some(page) = stream.message().await? {
                if let Some(head) = &page.head {
                    revision = Some(head.revision);
                }
                anyhow::ensure!(revision.is_some(), "a page came before its head");
                records += page.records.len() as u64;
                let last = page.last;
                writer.write(Frame::Page(page))?;
                if last {
                    return Ok((revision.unwrap_or_default(), records));
                }
            }
            anyhow::bail!("the stream ended before the image's last page")
        }
        .await;
        match outcome {
            Ok(done) => return Ok(done),
            Err(error) if attempt < GROUP_ATTEMPTS_MAX => tracing::warn!(group, %error, "backing up the group again"),
            Err(error) => return Err(error),
        }
    }
}

fn partial_path(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

fn file_sha256(path: &Path) -> anyhow::Result<Vec<u8>> {
    let mut file = std::io::BufReader::new(std::fs::File::open(path)?);
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            return Ok(context.finish().as_ref().to_vec());
        }
        context.update(&buffer[..read]);
    }
}

/// Reads the frames of a backup file in order; each checked to be whole and within bounds.
struct FrameReader {
    file: std::io::BufReader<std::fs::File>,
    digest: ring::digest::Context,
}

impl FrameReader {
    fn open(path: &Path) -> anyhow::Result<FrameReader> {
        let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        Ok(FrameReader { file: std::io::BufReader::new(file), digest: ring::digest::Context::new(&ring::digest::SHA256) })
    }

    /// The next frame (`None` at the end of the file), and the SHA-256 of the file before it.
    fn next(&mut self) -> anyhow::Result<Option<(Frame, Vec<u8>)>> {
        let before = self.digest.clone().finish().as_ref().to_vec();
        let mut length = [0u8; 4];
        match self.file.read_exact(&mut length) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(error) => return Err(error.into()),
        }
        let size = u32::from_be_bytes(length) as usize;
        anyhow::ensure!(size <= FRAME_BYTES_MAX, "a frame of {size} bytes: not a backup, or a corrupt one");
        let mut bytes = vec![0u8; size];
        self.file.read_exact(&mut bytes).context("the file ends inside a frame: truncated")?;
        self.digest.update(&length);
        self.digest.update(&bytes);
        let frame = BackupFrame::decode(bytes.as_slice()).context("a frame does not decode: corrupt")?.frame.context("an empty frame")?;
        Ok(Some((frame, before)))
    }
}

/// A checked backup: its manifest, per group (in the backup's order) its head, and the id
/// its restores run under.
struct Checked {
    manifest: BackupManifest,
    heads: Vec<BackupGroupHead>,
    summary: Summary,
    restore_id: u64,
}

/// Reads the whole file once: whole, untouched (its SHA-256), well formed, and every path in
/// it once: the groups' descriptors partition the namespace ([`check_partition`]) and each
/// record lies in its own group's, in key order. `cluster` (a restore's, by group id) lists
/// the prefixes of the groups that will serve the restored paths: a record one of them would
/// serve instead of its own group's is refused here, before a restore changes anything.
fn check(path: &Path, cluster: &[(u64, String)]) -> anyhow::Result<Checked> {
    let mut reader = FrameReader::open(path)?;
    let Some((Frame::Manifest(manifest), _)) = reader.next()? else { anyhow::bail!("{} does not begin with a backup manifest", path.display()) };
    anyhow::ensure!(manifest.format == FORMAT, "backup format {} (this binary reads {FORMAT})", manifest.format);
    let mut heads: Vec<BackupGroupHead> = Vec::new();
    let mut summary = Summary::default();
    let mut open = false;
    // The group's last record: its records come in key order, each once.
    let mut last_key = Vec::new();
    loop {
        match reader.next()? {
            Some((Frame::Page(page), _)) => {
                match (&page.head, open) {
                    (Some(head), false) => {
                        let prefix = head.descriptor.as_ref().map(|d| d.prefix.clone()).context("a group without a descriptor")?;
                        anyhow::ensure!(!summary.groups.contains_key(&prefix), "two groups serve {prefix}");
                        summary.groups.insert(prefix, (head.group_id, head.revision, 0));
                        heads.push(head.clone());
                    }
                    (None, true) => {}
                    _ => anyhow::bail!("pages out of order"),
                }
                let served = heads.last().and_then(|h| h.descriptor.as_ref()).context("a group without a descriptor")?;
                if page.head.is_some() {
                    last_key.clear();
                }
                for record in &page.records {
                    check_record(served, cluster, record, &last_key)?;
                    last_key.clone_from(&record.key);
                }
                if let Some((_, _, records)) = summary.groups.get_mut(&served.prefix) {
                    *records += page.records.len() as u64;
                }
                open = !page.last;
            }
            Some((Frame::End(end), sha256)) => {
                anyhow::ensure!(!open, "the end came inside a group's pages");
                anyhow::ensure!(end.sha256 == sha256, "the file's SHA-256 does not match its end: corrupt");
                anyhow::ensure!(end.groups == heads.len() as u64, "the end counts {} groups, the file has {}", end.groups, heads.len());
                anyhow::ensure!(reader.next()?.is_none(), "bytes after the end");
                check_partition(&heads)?;
                summary.bytes = std::fs::metadata(path)?.len();
                let restore_id = end.sha256.first_chunk::<8>().map_or(0, |bytes| u64::from_be_bytes(*bytes)).max(1);
                return Ok(Checked { manifest, heads, summary, restore_id });
            }
            Some((Frame::Manifest(_), _)) => anyhow::bail!("a second manifest"),
            None => anyhow::bail!("the file ends before its end frame: truncated"),
        }
    }
}

/// Whether `served` (a group's descriptor at its image) held `record`, which comes after
/// `last_key` in the group's image; and, on a restore, that no group of `cluster` below the
/// group's prefix serves it.
fn check_record(
    served: &GroupDescriptor,
    cluster: &[(u64, String)],
    record: &warden_proto::namespace::SubtreeRecord,
    last_key: &[u8],
) -> anyhow::Result<()> {
    // Where the group's own check puts it when restored: a node at its path, a child entry
    // with its parent.
    let path = match parse_subtree_key(&record.key) {
        Some(SubtreeKey::Node(path) | SubtreeKey::Child(path, _)) => path,
        Some(SubtreeKey::Lock(_)) | None => {
            anyhow::bail!("group {} ({}) holds a record that is no node nor child entry: corrupt", served.group_id, served.prefix)
        }
    };
    anyhow::ensure!(record.key.as_slice() > last_key, "group {} ({}) holds {path} twice, or out of order: corrupt", served.group_id, served.prefix);
    anyhow::ensure!(
        descriptor::serves(Some(served), path),
        "group {} ({}) holds {path}, which it did not serve at its image: corrupt",
        served.group_id,
        served.prefix
    );
    if let Some((group, prefix)) = cluster.iter().find(|(_, prefix)| is_strictly_below(prefix, &served.prefix) && is_at_or_below(path, prefix)) {
        anyhow::bail!(
            "the backup's group of {} holds {path}, which this cluster's group {group} ({prefix}) serves: restore into a cluster without that group (nothing was changed)",
            served.prefix
        );
    }
    Ok(())
}

/// Whether the groups' descriptors at their images partition the namespace: `/` is served,
/// and each group leaves out exactly the prefixes of the file's groups right below it, so
/// every path is served by exactly one image. Images taken across a move fail it: a merge
/// between its hand-over and its end (the parent still leaves the subtree out, the merged
/// group serves nothing), a split half-way (the source leaves out a subtree no image has),
/// or a source imaged before a hand-over and its target after (both serve the subtree).
fn check_partition(heads: &[BackupGroupHead]) -> anyhow::Result<()> {
    let descriptors: Vec<&GroupDescriptor> = heads.iter().filter_map(|h| h.descriptor.as_ref()).collect();
    let prefixes: Vec<&str> = descriptors.iter().map(|d| d.prefix.as_str()).collect();
    anyhow::ensure!(prefixes.contains(&"/"), "no group of the backup serves /");
    // The deepest of the prefixes strictly above `prefix`.
    let parent = |prefix: &str| prefixes.iter().copied().filter(|above| is_strictly_below(prefix, above)).max_by_key(|above| above.len());
    for served in descriptors.iter().copied() {
        let mut below: Vec<&str> = prefixes.iter().copied().filter(|prefix| parent(prefix) == Some(served.prefix.as_str())).collect();
        let mut excluded: Vec<&str> = served.excluded.iter().map(String::as_str).collect();
        below.sort_unstable();
        excluded.sort_unstable();
        anyhow::ensure!(
            below == excluded,
            "group {} served {} without {excluded:?} at its image, but the backup's groups right below it serve {below:?}: its images are of different routes (a subtree moved while it was read)",
            served.group_id,
            served.prefix
        );
    }
    Ok(())
}

/// Restores the backup at `from` into the fresh cluster `seeds` reach (see the module's doc).
///
/// 1. Once no subtree moves in the cluster, the whole file is read and checked (its
///    SHA-256, its frames, each path once, and each record in the group that will serve it
///    here: a cluster group below one of the backup's would serve some of its records).
/// 2. Each group of the cluster serving one of the backup's prefixes is asked whether it
///    takes the backup ([`probe`]): a group holding nodes that no run of this file restored
///    is refused before anything changes.
/// 3. A group is created for each prefix no group serves, parents first (a group's prefix is
///    carved out of the group serving its parent path).
/// 4. Each group's pages, in order, through its leader, under the file's restore id: a group
///    an earlier run of this file restored takes them as changing nothing, one it left half
///    restored (refusing writes) is restored again from its first page and then serves.
/// 5. Placement's state last (a quota set on restored nodes counts them); setting each again
///    changes nothing.
pub async fn restore(seeds: &[String], from: &Path) -> anyhow::Result<Summary> {
    let mut table = settled_table(seeds, MOVE_WAIT).await?;
    let cluster: Vec<(u64, String)> = serving_groups(&table).into_iter().collect();
    let checked = check(from, &cluster)?;
    let mut prefixes: Vec<&str> = checked.heads.iter().filter_map(|h| h.descriptor.as_ref()).map(|d| d.prefix.as_str()).collect();
    prefixes.sort_by_key(|prefix| (prefix.matches('/').count(), prefix.to_string()));
    // A merged group keeps its prefix while it homes sessions: no group can be created there.
    for retired in table.groups.iter().filter(|g| g.retired).filter_map(|g| g.descriptor.as_ref()) {
        anyhow::ensure!(
            !prefixes.contains(&retired.prefix.as_str()),
            "group {} holds {} merged away, until its sessions end: the backup's group there cannot be created yet (nothing was changed)",
            retired.group_id,
            retired.prefix
        );
    }
    for (group, prefix) in cluster.iter().filter(|(_, prefix)| prefixes.contains(&prefix.as_str())) {
        probe(&table, *group, checked.restore_id).await.with_context(|| format!("the group serving {prefix} is not fresh"))?;
    }
    for prefix in prefixes {
        if !serving_groups(&table).values().any(|served| served == prefix) {
            create_group(seeds, prefix).await.with_context(|| format!("creating the group of {prefix}"))?;
            table = routing_table(seeds, CALL_PATIENCE).await?;
        }
    }
    let restore_id = checked.restore_id;
    let mut reader = FrameReader::open(from)?;
    let mut target = None;
    let mut first = false;
    let mut revision_floor = 0;
    while let Some((frame, _)) = reader.next()? {
        let Frame::Page(page) = frame else { continue };
        if let Some(head) = &page.head {
            let prefix = head.descriptor.as_ref().map(|d| d.prefix.as_str()).unwrap_or_default();
            let group = serving_groups(&table).into_iter().find(|(_, served)| served == prefix).map(|(id, _)| id);
            target = Some(group.with_context(|| format!("no group serves {prefix} in the cluster"))?);
            first = true;
            revision_floor = head.revision;
        }
        let group_id = target.context("pages out of order")?;
        let page = warden_proto::namespace::RestorePage { restore_id, first, last: page.last, records: page.records, revision_floor };
        first = false;
        restore_page(&table, group_id, page).await.with_context(|| format!("restoring into group {group_id}"))?;
    }
    restore_placement(seeds, &checked.manifest).await?;
    Ok(checked.summary)
}

/// Whether `group_id` takes the backup whose restores run as `restore_id`, changing
/// nothing it holds: a group that id restored, or is restoring (a run that died), goes on
/// with it (an empty page that is neither first nor last); any other is asked as a first
/// page would be, with an empty restore of its own: refused NOT_EMPTY by a group holding
/// nodes. An unfinished restore of another file the group discards: the first send starts
/// deleting its records (a page at a time, by the group's leader), the second waits until
/// they are gone (UNAVAILABLE meanwhile) and then ends the empty restore.
async fn probe(table: &RoutingTable, group_id: u64, restore_id: u64) -> anyhow::Result<()> {
    let ours = warden_proto::namespace::RestorePage { restore_id, ..Default::default() };
    match restore_page_answer(table, group_id, ours).await? {
        Ok(_) => return Ok(()),
        // "Not running here": neither restored nor being restored by this file.
        Err((_, status)) if warden_proto::error_of(&status).is_some_and(|e| e.code == Code::InvalidArgument as i32) => {}
        Err((addr, status)) => anyhow::bail!("{addr}: {}", status.message()),
    }
    let fresh = warden_proto::namespace::RestorePage { restore_id: rand::random::<u64>().max(1), first: true, last: true, ..Default::default() };
    for _ in 0..2 {
        let answer = restore_page_within(table, group_id, fresh.clone(), DISCARD_PATIENCE).await?;
        answer.map_err(|(addr, status)| anyhow::anyhow!("{addr}: {}", status.message()))?;
    }
    Ok(())
}

/// Has the leader of `group_id` apply `page`.
async fn restore_page(table: &RoutingTable, group_id: u64, page: warden_proto::namespace::RestorePage) -> anyhow::Result<()> {
    restore_page_answer(table, group_id, page).await?.map_err(|(addr, status)| anyhow::anyhow!("{addr}: {}", status.message()))?;
    Ok(())
}

/// [`restore_page`], answering a refusal as its status.
async fn restore_page_answer(
    table: &RoutingTable,
    group_id: u64,
    page: warden_proto::namespace::RestorePage,
) -> anyhow::Result<Result<RestorePageResponse, (String, tonic::Status)>> {
    restore_page_within(table, group_id, page, CALL_PATIENCE).await
}

/// [`restore_page_answer`], retried for up to `patience`.
async fn restore_page_within(
    table: &RoutingTable,
    group_id: u64,
    page: warden_proto::namespace::RestorePage,
    patience: Duration,
) -> anyhow::Result<Result<RestorePageResponse, (String, tonic::Status)>> {
    let request = RestorePageRequest { group_id, page: Some(page) };
    at_any_answer(&replica_addrs(table, group_id), patience, |mut c| {
        let request = request.clone();
        async move { c.restore_page(request).await }
    })
    .await
}

/// Gives the cluster the backup's limits, quotas and ACL (placement's state).
async fn restore_placement(seeds: &[String], manifest: &BackupManifest) -> anyhow::Result<()> {
    if let Some(limits) = manifest.limits {
        let changes = warden_proto::v1::ApplyLimits { version: 0, ..limits };
        at_any_within(seeds, CALL_PATIENCE, |mut c| async move { c.set_limits(SetLimitsRequest { changes: Some(changes) }).await }).await?;
    }
    for quota in manifest.quotas.iter().flat_map(|list| &list.quotas).filter(|quota| quota.limits.is_some()) {
        let request = SetQuotaRequest { prefix: quota.prefix.clone(), limits: quota.limits, remove: false };
        at_any_within(seeds, CALL_PATIENCE, |mut c| {
            let request = request.clone();
            async move { c.set_quota(request).await }
        })
        .await?;
    }
    let acl = manifest.acl.clone().unwrap_or_default();
    for grant in acl.grants {
        let request = ChangeAclRequest { prefix: grant.prefix, principal: grant.principal, permissions: grant.permissions, revoke: false };
        at_any_within(seeds, CALL_PATIENCE, |mut c| {
            let request = request.clone();
            async move { c.change_acl(request).await }
        })
        .await?;
    }
    for group in acl.groups {
        for member in group.members {
            let request = ChangeAclGroupRequest { group: group.name.clone(), principal: member, remove: false };
            at_any_within(seeds, CALL_PATIENCE, |mut c| {
                let request = request.clone();
                async move { c.change_acl_group(request).await }
            })
            .await?;
        }
    }
    Ok(())
}
