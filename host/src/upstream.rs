//! Upstream connections for the router and for `dispatch_http_call`: endpoint resolution
//! (STATIC / STRICT_DNS / LOGICAL_DNS), the cluster's `connect_timeout`, TLS, HTTP/1.1, and
//! a per-worker pool of idle keep-alive connections (Envoy's pools are per worker too).
//!
//! The failures the router turns into local replies are typed here: no address
//! (`no_healthy_upstream`), connect or TLS failure (`connection_failure`), and a
//! connection that dies before the response headers (`connection_termination`).
//!
//! With `HttpProtocolOptions.upstream_http_protocol_options.auto_sni` the SNI of a new
//! connection is the host of the request's `:authority` as the router sends it (after
//! `host_rewrite_literal`; not for an IP address, which keeps the cluster's `sni`), as
//! router.cc sets `Network::UpstreamServerName`; Envoy keys its connection pools by these
//! transport socket options, so the idle connections here are kept per (cluster, SNI).
//! This applies to `dispatch_http_call` too (the async client runs the same router).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::body::HostBody;
use crate::busy_poll::Active;
use crate::config::{Cluster, DiscoveryType};
use crate::tls;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("no healthy upstream: {0}")]
    NoHealthyUpstream(String),
    #[error("connection failure: {0}")]
    ConnectFailure(String),
    #[error("connection termination: {0}")]
    Terminated(String),
}

/// The address a response came from (`%UPSTREAM_HOST%`), in the response's extensions.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamAddress(pub SocketAddr);

/// An idle keep-alive connection and the address it goes to.
type Idle = (SendRequest<HostBody>, SocketAddr);

/// Idle connections by cluster and the SNI they were opened with.
type IdleKey = (String, Option<String>);

/// A cluster ready to connect to: config plus its TLS client config.
pub struct Upstream {
    pub cluster: Arc<Cluster>,
    tls: Option<Arc<ClientConfig>>,
    /// Round-robin position for STRICT_DNS clusters with several hosts.
    next: Cell<usize>,
}

impl Upstream {
    pub fn new(cluster: Arc<Cluster>) -> Result<Self, String> {
        let tls = match &cluster.tls {
            Some(settings) => Some(tls::client_config(settings)?),
            None => None,
        };
        Ok(Self {
            cluster,
            tls,
            next: Cell::new(0),
        })
    }
}

/// The clusters of one worker and its idle connections.
#[derive(Default)]
pub struct Pool {
    pub upstreams: HashMap<String, Rc<Upstream>>,
    idle: RefCell<HashMap<IdleKey, Vec<Idle>>>,
}

impl Pool {
    pub fn new(clusters: &HashMap<String, Arc<Cluster>>) -> Result<Rc<Self>, String> {
        let mut upstreams = HashMap::new();
        for (name, cluster) in clusters {
            upstreams.insert(name.clone(), Rc::new(Upstream::new(Arc::clone(cluster))?));
        }
        Ok(Rc::new(Self {
            upstreams,
            idle: RefCell::default(),
        }))
    }

    fn take_idle(&self, key: &IdleKey) -> Option<Idle> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(key)?;
        while let Some((sender, address)) = list.pop() {
            if !sender.is_closed() && sender.is_ready() {
                return Some((sender, address));
            }
        }
        None
    }

    /// Sends `request` to `cluster` and returns the response head with a streaming body.
    pub async fn send(
        self: &Rc<Self>,
        cluster: &str,
        request: Request<HostBody>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let upstream = self
            .upstreams
            .get(cluster)
            .cloned()
            .ok_or_else(|| UpstreamError::NoHealthyUpstream(format!("unknown cluster {cluster}")))?;
        let sni = auto_sni(&upstream, &request);
        let key = (cluster.to_owned(), sni);
        let (mut sender, address) = match self.take_idle(&key) {
            Some(idle) => idle,
            None => connect(&upstream, key.1.as_deref()).await?,
        };
        let mut response = sender
            .send_request(request)
            .await
            .map_err(|e| UpstreamError::Terminated(e.to_string()))?;
        response.extensions_mut().insert(UpstreamAddress(address));
        // Back to the pool once the response body has been read (ready() resolves then).
        let pool = Rc::clone(self);
        tokio::task::spawn_local(async move {
            if sender.ready().await.is_ok() {
                pool.idle.borrow_mut().entry(key).or_default().push((sender, address));
            }
        });
        Ok(response)
    }
}

/// The SNI `auto_sni` asks for: the request's host without its port, unless it is an IP
/// address (router.cc `decodeHeaders`, `parseAuthority(...).is_ip_address_`).
fn auto_sni(upstream: &Upstream, request: &Request<HostBody>) -> Option<String> {
    if !upstream.cluster.http.auto_sni || upstream.tls.is_none() {
        return None;
    }
    let authority = request.headers().get(hyper::header::HOST)?.to_str().ok()?;
    let host = authority_host(authority);
    if host.is_empty() || host.parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    Some(host.to_owned())
}

/// The host part of an authority (`Http::Utility::parseAuthority`): `[v6]:port`, `host:port`
/// or `host`; a bare IPv6 address is kept whole.
fn authority_host(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

async fn resolve(upstream: &Upstream) -> Result<Vec<SocketAddr>, UpstreamError> {
    let cluster = &upstream.cluster;
    let mut addresses = Vec::new();
    for endpoint in &cluster.endpoints {
        match cluster.discovery {
            DiscoveryType::Static => {
                let ip = endpoint
                    .host
                    .parse()
                    .map_err(|_| UpstreamError::NoHealthyUpstream(endpoint.host.clone()))?;
                addresses.push(SocketAddr::new(ip, endpoint.port));
            }
            DiscoveryType::StrictDns | DiscoveryType::LogicalDns => {
                if let Ok(found) = tokio::net::lookup_host((endpoint.host.as_str(), endpoint.port)).await {
                    let found: Vec<SocketAddr> = found.collect();
                    // LOGICAL_DNS uses the first address only; STRICT_DNS every one.
                    if cluster.discovery == DiscoveryType::LogicalDns {
                        addresses.extend(found.first());
                    } else {
                        addresses.extend(found);
                    }
                }
            }
        }
    }
    if addresses.is_empty() {
        return Err(UpstreamError::NoHealthyUpstream(format!(
            "cluster {} has no resolvable endpoint",
            cluster.name
        )));
    }
    Ok(addresses)
}

async fn connect(upstream: &Upstream, sni: Option<&str>) -> Result<Idle, UpstreamError> {
    let addresses = resolve(upstream).await?;
    let index = upstream.next.get() % addresses.len();
    upstream.next.set(index.wrapping_add(1));
    let address = addresses
        .get(index)
        .copied()
        .ok_or_else(|| UpstreamError::NoHealthyUpstream(upstream.cluster.name.clone()))?;
    let cluster = &upstream.cluster;
    let tcp = tokio::time::timeout(cluster.connect_timeout, TcpStream::connect(address))
        .await
        .map_err(|_| UpstreamError::ConnectFailure(format!("connect to {address} timed out")))?
        .map_err(|e| UpstreamError::ConnectFailure(format!("connect to {address}: {e}")))?;
    let _ = tcp.set_nodelay(true);
    let sender = match &upstream.tls {
        None => handshake(TokioIo::new(Active(tcp))).await,
        Some(config) => {
            // auto_sni's name, else the cluster's `sni`, else the endpoint's host (rustls
            // needs a name to verify against; an IP address sends no SNI).
            let name = sni
                .map(str::to_owned)
                .or_else(|| cluster.tls.as_ref().and_then(|t| t.sni.clone()))
                .or_else(|| cluster.endpoints.first().map(|e| e.host.clone()))
                .unwrap_or_default();
            let server_name = tls::server_name(&name).map_err(UpstreamError::ConnectFailure)?;
            let connector = TlsConnector::from(Arc::clone(config));
            let stream = tokio::time::timeout(cluster.connect_timeout, connector.connect(server_name, tcp))
                .await
                .map_err(|_| UpstreamError::ConnectFailure("TLS handshake timed out".to_owned()))?
                .map_err(|e| UpstreamError::ConnectFailure(format!("TLS error: {e}")))?;
            handshake(TokioIo::new(Active(stream))).await
        }
    }?;
    Ok((sender, address))
}

async fn handshake<T>(io: TokioIo<T>) -> Result<SendRequest<HostBody>, UpstreamError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    let (sender, connection) = http1::handshake(io)
        .await
        .map_err(|e| UpstreamError::ConnectFailure(e.to_string()))?;
    tokio::task::spawn_local(async move {
        let _ = connection.await;
    });
    Ok(sender)
}
