//! Opening our own connection: which nodes it can serve (plain TCP speaking RESP2), the
//! TCP socket with the node's TCP settings, and the handshake that `AUTH`s and `SELECT`s
//! as the node's URL says.
//!
//! The socket takes from the node's `redis::ConnectionInfo` (its
//! `redis::io::tcp::TcpSettings`) what redis-rs would set: TCP keep-alive (with its idle
//! time, interval and probe count, where given), `SO_LINGER` and, on Linux,
//! `TCP_USER_TIMEOUT`. `TCP_NODELAY` is always on, whatever the settings say: a lock is a
//! small request whose round trip must not wait for Nagle's algorithm, and redis-rs's
//! default settings (`nodelay: false`) cannot be told from a choice. Connections that
//! redis-rs makes (TLS, Unix sockets, RESP3, clusters) apply the settings themselves.
//!
//! ```no_run
//! use std::time::Duration;
//! use redis::io::tcp::{TcpSettings, socket2::TcpKeepalive};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Keep-alive probes after 60 s idle, so a firewall keeps the idle connection open.
//! let info: redis::ConnectionInfo = "redis://:secret@127.0.0.1:6379/2".parse()?;
//! let info = info.set_tcp_settings(
//!     TcpSettings::default().set_keepalive(TcpKeepalive::new().with_time(Duration::from_secs(60))),
//! );
//! // A password and a database: the handshake sends AUTH and SELECT.
//! let redlock = tower_redlock::Redlock::builder([info]).build()?;
//! let lock = redlock.lock("invoice:42").await?;
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::io;
use std::time::Duration;

use redis::io::tcp::TcpSettings;
use redis::io::tcp::socket2::SockRef;
use redis::{RedisError, RedisResult};
use tokio::net::TcpStream;

use super::Wire;

/// The address and TCP settings of `client` when our own connection can serve it: plain
/// TCP speaking RESP2.
pub(crate) fn plain_tcp(client: &redis::Client) -> Option<(&str, u16, &TcpSettings)> {
    let info = client.get_connection_info();
    match info.addr() {
        redis::ConnectionAddr::Tcp(host, port)
            if info.redis_settings().protocol() == redis::ProtocolVersion::RESP2 =>
        {
            Some((host.as_str(), *port, info.tcp_settings()))
        }
        _ => None,
    }
}

/// Connects to `host:port` with `settings` applied to the socket as the module docs say:
/// keep-alive, linger and user timeout as given, `TCP_NODELAY` always on.
pub(crate) async fn tcp_stream(
    host: &str,
    port: u16,
    settings: &TcpSettings,
) -> io::Result<TcpStream> {
    let stream = TcpStream::connect((host, port)).await?;
    stream.set_nodelay(true)?;
    let socket = SockRef::from(&stream);
    if let Some(keepalive) = settings.keepalive() {
        socket.set_tcp_keepalive(keepalive)?;
    }
    if let Some(linger) = linger_time(settings) {
        socket.set_linger(Some(linger))?;
    }
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    if let Some(timeout) = settings.user_timeout() {
        socket.set_tcp_user_timeout(Some(timeout))?;
    }
    Ok(stream)
}

/// The linger time in `settings`, if one is set. redis-rs 1.8 has a setter for it and no
/// getter, so it is read from the settings' `Debug` output (`linger_time: Some(5s)`); the
/// tests pin that format, so a redis-rs that changes it fails them rather than dropping
/// the setting unnoticed.
fn linger_time(settings: &TcpSettings) -> Option<Duration> {
    let shown = format!("{settings:?}");
    let (_, rest) = shown.split_once("linger_time: Some(")?;
    let (value, _) = rest.split_once(')')?;
    debug_duration(value)
}

/// A `Duration` from its `Debug` text: `5s`, `1.5s`, `250ms`, `10µs`, `0ns`.
fn debug_duration(text: &str) -> Option<Duration> {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let (number, unit) = [
        ("ns", 1),
        ("µs", 1_000),
        ("ms", 1_000_000),
        ("s", NANOS_PER_SEC),
    ]
    .into_iter()
    .find_map(|(suffix, unit)| text.strip_suffix(suffix).map(|n| (n, unit)))?;
    let (whole, fraction) = match number.split_once('.') {
        Some((_, "")) => return None,
        Some((whole, fraction)) => (whole, fraction),
        None => (number, ""),
    };
    let mut nanos = whole.parse::<u128>().ok()?.checked_mul(unit)?;
    if !fraction.is_empty() {
        // At most nine digits: below a nanosecond of a second.
        let digits = u32::try_from(fraction.len()).ok().filter(|d| *d <= 9)?;
        let scale = 10u128.pow(digits);
        nanos = nanos.checked_add(fraction.parse::<u128>().ok()?.checked_mul(unit)? / scale)?;
    }
    let secs = u64::try_from(nanos / NANOS_PER_SEC).ok()?;
    let subsec = u32::try_from(nanos % NANOS_PER_SEC).ok()?;
    Some(Duration::new(secs, subsec))
}

/// Authenticates and selects the database as `settings` say, in one round trip. A wrong
/// user or password is `AuthenticationFailed`, without the credentials in the message.
pub(crate) async fn handshake(
    wire: &Wire,
    settings: &redis::RedisConnectionInfo,
) -> RedisResult<()> {
    let mut pipe = redis::pipe();
    let authenticates = settings.password().is_some();
    if let Some(password) = settings.password() {
        let auth = pipe.cmd("AUTH");
        if let Some(user) = settings.username() {
            auth.arg(user);
        }
        auth.arg(password);
    }
    if settings.db() != 0 {
        pipe.cmd("SELECT").arg(settings.db());
    }
    if pipe.is_empty() {
        return Ok(());
    }
    let commands = usize::from(authenticates) + usize::from(settings.db() != 0);
    let replies = wire.pipeline(&pipe.get_packed_pipeline(), commands).await?;
    for (i, reply) in replies.into_iter().enumerate() {
        if let Err(e) = reply.extract_error() {
            if authenticates && i == 0 {
                return Err(RedisError::from((
                    redis::ErrorKind::AuthenticationFailed,
                    "Password authentication failed",
                )));
            }
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use redis::io::tcp::TcpSettings;
    use redis::io::tcp::socket2::{SockRef, TcpKeepalive};

    use super::{debug_duration, linger_time, tcp_stream};

    /// The socket of our own connection carries the node's keep-alive (idle time,
    /// interval, probes), linger and user timeout, and `TCP_NODELAY`, read back from the
    /// socket.
    #[tokio::test]
    async fn the_socket_takes_the_nodes_tcp_settings() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let keepalive = TcpKeepalive::new()
            .with_time(Duration::from_secs(30))
            .with_interval(Duration::from_secs(5))
            .with_retries(3);
        let settings = TcpSettings::default()
            .set_keepalive(keepalive)
            .set_linger_time(Duration::from_secs(7));
        #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
        let settings = settings.set_user_timeout(Duration::from_secs(9));
        let stream = tcp_stream("127.0.0.1", port, &settings)
            .await
            .expect("connect");
        let socket = SockRef::from(&stream);
        assert!(socket.keepalive().expect("SO_KEEPALIVE"));
        assert_eq!(
            socket.tcp_keepalive_time().expect("TCP_KEEPIDLE"),
            Duration::from_secs(30)
        );
        assert_eq!(
            socket.tcp_keepalive_interval().expect("TCP_KEEPINTVL"),
            Duration::from_secs(5)
        );
        assert_eq!(socket.tcp_keepalive_retries().expect("TCP_KEEPCNT"), 3);
        assert_eq!(
            socket.linger().expect("SO_LINGER"),
            Some(Duration::from_secs(7))
        );
        assert!(socket.tcp_nodelay().expect("TCP_NODELAY"));
        #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
        assert_eq!(
            socket.tcp_user_timeout().expect("TCP_USER_TIMEOUT"),
            Some(Duration::from_secs(9))
        );

        // The default settings: no keep-alive, linger or user timeout; no delay all the
        // same (redis-rs's default says `nodelay: false`).
        let stream = tcp_stream("127.0.0.1", port, &TcpSettings::default())
            .await
            .expect("connect");
        let socket = SockRef::from(&stream);
        assert!(!socket.keepalive().expect("SO_KEEPALIVE"));
        assert_eq!(socket.linger().expect("SO_LINGER"), None);
        assert!(socket.tcp_nodelay().expect("TCP_NODELAY"));
        #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
        assert_eq!(socket.tcp_user_timeout().expect("TCP_USER_TIMEOUT"), None);
    }

    /// The linger time comes back from `TcpSettings`, whose `Debug` output is the only
    /// way to read it: a redis-rs that shows it otherwise fails here.
    #[test]
    fn the_linger_time_is_read_back() {
        assert_eq!(linger_time(&TcpSettings::default()), None);
        for linger in [
            Duration::ZERO,
            Duration::from_secs(5),
            Duration::from_millis(1_500),
            Duration::from_millis(250),
            Duration::from_micros(10),
            Duration::new(3, 1),
            Duration::from_secs(86_400 * 365),
        ] {
            let settings = TcpSettings::default()
                .set_keepalive(TcpKeepalive::new().with_time(Duration::from_secs(60)))
                .set_linger_time(linger);
            assert_eq!(linger_time(&settings), Some(linger), "{settings:?}");
        }
        for bad in ["", "s", "5", "1.s", "x5s", "1.0000000001s", "5h"] {
            assert_eq!(debug_duration(bad), None, "{bad}");
        }
    }
}
