//! The security flags every `warden` command takes: `--ca`, `--cert`, `--key`,
//! `--token` and `--tokens`, also from `WARDEN_CA`, `WARDEN_CERT`, `WARDEN_KEY`,
//! `WARDEN_TOKEN`, `WARDEN_TOKENS`. `--ca` with `--cert` and `--key` turns TLS on; a client
//! may instead give `--ca` and `--token` (no certificate of its own); none leaves it off.

use std::path::PathBuf;
use std::sync::Arc;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use warden_proto::channel::{ChannelCache, ChannelSettings};
use warden_proto::tls::{Expected, Tls, TlsFiles, Tokens};

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
    /// A bearer token naming this client's principal (with --ca, instead of a certificate;
    /// `warden admin token` makes one).
    #[arg(long, global = true, env = "WARDEN_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// For `warden node` and `warden router`: a file of `NAME SHA256-HEX` lines whose tokens
    /// the client ports also accept (read again when it changes).
    #[arg(long, global = true, env = "WARDEN_TOKENS", value_name = "FILE")]
    pub tokens: Option<PathBuf>,
}

impl TlsArgs {
    /// The TLS these flags set up: `None` without any of them, an error with only some.
    pub fn load(&self) -> anyhow::Result<Option<Arc<Tls>>> {
        let tokens = self.tokens.as_deref().map(Tokens::load).transpose()?;
        match (&self.ca, &self.cert, &self.key) {
            (None, None, None) => {
                anyhow::ensure!(tokens.is_none() && self.token.is_none(), "tokens need TLS: give --ca (and --cert, --key)");
                Ok(None)
            }
            (Some(ca), Some(cert), Some(key)) => {
                Ok(Some(Tls::load_with_tokens(TlsFiles { ca: ca.clone(), cert: cert.clone(), key: key.clone() }, tokens)?))
            }
            (Some(ca), None, None) if self.token.is_some() => Ok(Some(Tls::load_ca_only(ca.clone())?)),
            _ => anyhow::bail!("TLS needs all of --ca, --cert and --key (or --ca and --token for a client)"),
        }
    }
}

/// Adds the command's bearer token (if any) to each call.
#[derive(Clone)]
pub struct Bearer(Option<tonic::metadata::AsciiMetadataValue>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        warden_proto::tls::tokens::authorize(&mut request, self.0.as_ref());
        Ok(request)
    }
}

/// A channel of a command: its TLS, and its bearer token on every call.
pub type CommandChannel = InterceptedService<Channel, Bearer>;

/// The bearer token of this command-line process, set with its TLS.
static COMMAND_TOKEN: std::sync::OnceLock<Bearer> = std::sync::OnceLock::new();

/// The TLS of this command-line process: one identity for all its connections, set once
/// when a command starts ([`use_for_commands`]), read by [`node_channel`].
static COMMAND_TLS: std::sync::OnceLock<Option<Arc<Tls>>> = std::sync::OnceLock::new();

/// Loads `args` as the TLS of this command's connections to nodes.
pub fn use_for_commands(args: &TlsArgs) -> anyhow::Result<()> {
    let tls = args.load()?;
    let bearer = match &args.token {
        Some(token) => Some(warden_proto::tls::tokens::bearer(token).ok_or_else(|| anyhow::anyhow!("a token is printable ASCII"))?),
        None => None,
    };
    // Set once per process: a second call (there is none) keeps the first.
    let _ = COMMAND_TLS.set(tls);
    let _ = COMMAND_TOKEN.set(Bearer(bearer));
    Ok(())
}

/// This process's channels by address: a command that makes many calls (a restore's pages,
/// a watch's retries) keeps one connection per node instead of opening one per call. Made
/// on first use, with the command's TLS ([`use_for_commands`] comes first).
static COMMAND_CHANNELS: std::sync::OnceLock<ChannelCache<CommandChannel>> = std::sync::OnceLock::new();

/// A lazily connected channel to the node (client port) or router at `addr`, with this
/// command's TLS; the same one (a clone) for every call to `addr` in this process.
pub fn node_channel(addr: &str) -> anyhow::Result<CommandChannel> {
    let channels = COMMAND_CHANNELS.get_or_init(|| {
        let settings = ChannelSettings::new(Expected::NodeOrRouter).with_connect_timeout(std::time::Duration::from_secs(1));
        ChannelCache::new(COMMAND_TLS.get().cloned().flatten(), settings)
    });
    let bearer = || COMMAND_TOKEN.get().cloned().unwrap_or(Bearer(None));
    Ok(channels.get_with(addr, |channel| InterceptedService::new(channel, bearer()))?)
}
