//! `warden admin backup` and `warden admin restore` (issue 18; ARCHITECTURE.md "Backup and
//! restore").
//!
//! A backup is a file of frames (`BackupFrame` in `placement.proto`): a manifest (placement's
//! state: the routing table, quotas, limits, ACL), each group's pages as its nodes stream
//! them (`Placement.BackupGroup`: one consistent image per group, writes going on), and an
//! end frame with the SHA-256 of everything before it. It is written to `FILE.partial` and
//! renamed once complete, so a file named FILE is always a whole backup.
//!
//! A restore reads the whole file once to check it, then gives a fresh cluster placement's
//! state (limits, quotas, ACL), a group for every prefix the backup has, and each group's
//! pages through the log (`Placement.RestorePage`).

use std::collections::BTreeMap;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use prost::Message as _;
use warden_proto::placement::backup_frame::Frame;
use warden_proto::placement::*;

use crate::admin::{at_any_within, create_group, routing_table};

/// The file format this binary writes and reads.
const FORMAT: u32 = 1;
/// Largest frame a restore reads (a page is at most 1 MiB of records, plus framing).
const FRAME_BYTES_MAX: usize = 8 << 20;
/// Bytes of records per page asked of the nodes.
const PAGE_BYTES: u32 = 1 << 20;
/// How long one call (a page, a group's stream start) may keep failing over before the
/// backup or restore gives up.
const CALL_PATIENCE: Duration = Duration::from_secs(30);
/// Attempts at one group's image (a replica may go away mid-stream).
const GROUP_ATTEMPTS_MAX: usize = 5;

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

/// The addresses of `group`'s replicas in `table`.
fn replica_addrs(table: &RoutingTable, group: u64) -> Vec<String> {
    let replicas = table.groups.iter().filter_map(|g| g.descriptor.as_ref()).find(|d| d.group_id == group).map(|d| d.replicas.clone());
    let addr = |id: &u64| table.nodes.iter().find(|n| n.id == *id).map(|n| n.addr.clone());
    replicas.unwrap_or_default().iter().filter_map(addr).collect()
}

/// Backs up every group of the cluster `seeds` reach into `out` (see the module's doc).
pub async fn backup(seeds: &[String], out: &Path) -> anyhow::Result<Summary> {
    let table = routing_table(seeds, CALL_PATIENCE).await?;
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
    // Each image is of its group as it was; if groups split or merged meanwhile, a subtree
    // may be in two images or none.
    let after = serving_groups(&routing_table(seeds, CALL_PATIENCE).await?);
    anyhow::ensure!(after == groups, "groups were created, split or merged during the backup: run it again");
    writer.file.flush()?;
    let sha256 = file_sha256(&partial)?;
    let records = summary.groups.values().map(|(_, _, records)| records).sum();
    writer.write(Frame::End(BackupEnd { groups: groups.len() as u64, records, sha256 }))?;
    let file = writer.file.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    summary.bytes = writer.offset;
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

/// A checked backup: its manifest, and per group (in the backup's order) its head.
struct Checked {
    manifest: BackupManifest,
    heads: Vec<BackupGroupHead>,
    summary: Summary,
}

/// Reads the whole file once: whole, untouched (its SHA-256), and well formed.
fn check(path: &Path) -> anyhow::Result<Checked> {
    let mut reader = FrameReader::open(path)?;
    let Some((Frame::Manifest(manifest), _)) = reader.next()? else { anyhow::bail!("{} does not begin with a backup manifest", path.display()) };
    anyhow::ensure!(manifest.format == FORMAT, "backup format {} (this binary reads {FORMAT})", manifest.format);
    let mut heads: Vec<BackupGroupHead> = Vec::new();
    let mut summary = Summary::default();
    let mut open = false;
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
                if let Some((_, _, records)) = heads.last().and_then(|h| h.descriptor.as_ref()).and_then(|d| summary.groups.get_mut(&d.prefix)) {
                    *records += page.records.len() as u64;
                }
                open = !page.last;
            }
            Some((Frame::End(end), sha256)) => {
                anyhow::ensure!(!open, "the end came inside a group's pages");
                anyhow::ensure!(end.sha256 == sha256, "the file's SHA-256 does not match its end: corrupt");
                anyhow::ensure!(end.groups == heads.len() as u64, "the end counts {} groups, the file has {}", end.groups, heads.len());
                anyhow::ensure!(reader.next()?.is_none(), "bytes after the end");
                summary.bytes = std::fs::metadata(path)?.len();
                return Ok(Checked { manifest, heads, summary });
            }
            Some((Frame::Manifest(_), _)) => anyhow::bail!("a second manifest"),
            None => anyhow::bail!("the file ends before its end frame: truncated"),
        }
    }
}

/// Restores the backup at `from` into the fresh cluster `seeds` reach (see the module's doc).
///
/// 1. The whole file is read and checked (its SHA-256, its frames).
/// 2. Each group of the cluster serving one of the backup's prefixes is asked whether it is
///    fresh (an empty restore: refused by a group holding nodes), so a cluster with data is
///    refused before anything changes.
/// 3. A group is created for each prefix no group serves, parents first (a group's prefix is
///    carved out of the group serving its parent path).
/// 4. Each group's pages, in order, through its leader.
/// 5. Placement's state last: a quota set on restored nodes counts them.
pub async fn restore(seeds: &[String], from: &Path) -> anyhow::Result<Summary> {
    let checked = check(from)?;
    let mut prefixes: Vec<&str> = checked.heads.iter().filter_map(|h| h.descriptor.as_ref()).map(|d| d.prefix.as_str()).collect();
    prefixes.sort_by_key(|prefix| (prefix.matches('/').count(), prefix.to_string()));
    let mut table = routing_table(seeds, CALL_PATIENCE).await?;
    for (group, prefix) in serving_groups(&table).into_iter().filter(|(_, prefix)| prefixes.contains(&prefix.as_str())) {
        let probe = warden_proto::namespace::RestorePage { restore_id: rand::random::<u64>().max(1), first: true, last: true, ..Default::default() };
        restore_page(&table, group, probe).await.with_context(|| format!("the group serving {prefix} is not fresh"))?;
    }
    for prefix in prefixes {
        if !serving_groups(&table).values().any(|served| served == prefix) {
            create_group(seeds, prefix).await.with_context(|| format!("creating the group of {prefix}"))?;
            table = routing_table(seeds, CALL_PATIENCE).await?;
        }
    }
    let restore_id = rand::random::<u64>().max(1);
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

/// Has the leader of `group_id` apply `page`.
async fn restore_page(table: &RoutingTable, group_id: u64, page: warden_proto::namespace::RestorePage) -> anyhow::Result<()> {
    let request = RestorePageRequest { group_id, page: Some(page) };
    at_any_within(&replica_addrs(table, group_id), CALL_PATIENCE, |mut c| {
        let request = request.clone();
        async move { c.restore_page(request).await }
    })
    .await?;
    Ok(())
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
