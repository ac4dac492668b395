//! The TLS flags every `warden` command takes (issue 17): `--ca`, `--cert`, `--key`, also
//! from `WARDEN_CA`, `WARDEN_CERT`, `WARDEN_KEY`. All three turn TLS on; none leaves it off.

use std::path::PathBuf;
use std::sync::Arc;

use warden_proto::tls::{Tls, TlsFiles};

/// `--ca`, `--cert`, `--key`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TlsArgs {
    /// The cluster's CA certificate (PEM): every peer must prove itself with a certificate it
    /// signed. With --cert and --key, turns TLS on.
    #[arg(long, global = true, env = "WARDEN_CA", value_name = "PEM")]
    pub ca: Option<PathBuf>,
    /// This process's certificate (PEM), naming it: `warden://node/ID`, `warden://router/NAME`
    /// or `warden://client/NAME` (`warden admin certs` makes them).
    #[arg(long, global = true, env = "WARDEN_CERT", value_name = "PEM")]
    pub cert: Option<PathBuf>,
    /// This process's private key (PEM).
    #[arg(long, global = true, env = "WARDEN_KEY", value_name = "PEM")]
    pub key: Option<PathBuf>,
}

impl TlsArgs {
    /// The TLS these flags set up: `None` without any of them, an error with only some.
    pub fn load(&self) -> anyhow::Result<Option<Arc<Tls>>> {
        match (&self.ca, &self.cert, &self.key) {
            (None, None, None) => Ok(None),
            (Some(ca), Some(cert), Some(key)) => Ok(Some(Tls::load(TlsFiles { ca: ca.clone(), cert: cert.clone(), key: key.clone() })?)),
            _ => anyhow::bail!("TLS needs all of --ca, --cert and --key"),
        }
    }
}

/// The TLS of this command-line process: one identity for all its connections, set once
/// when a command starts ([`use_for_commands`]), read by [`node_channel`].
static COMMAND_TLS: std::sync::OnceLock<Option<Arc<Tls>>> = std::sync::OnceLock::new();

/// Loads `args` as the TLS of this command's connections to nodes.
pub fn use_for_commands(args: &TlsArgs) -> anyhow::Result<()> {
    let tls = args.load()?;
    // Set once per process: a second call (there is none) keeps the first.
    let _ = COMMAND_TLS.set(tls);
    Ok(())
}

/// A lazily connected channel to the node (client port) or router at `addr`, with this
/// command's TLS.
pub fn node_channel(addr: &str) -> anyhow::Result<tonic::transport::Channel> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?.connect_timeout(std::time::Duration::from_secs(1));
    let tls = COMMAND_TLS.get().and_then(Option::as_ref);
    Ok(warden_proto::tls::lazy_channel(endpoint, tls, warden_proto::tls::Expected::NodeOrRouter))
}
