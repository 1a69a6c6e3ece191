//! Opening our own connection: which nodes it can serve (plain TCP speaking RESP2), and
//! the handshake that `AUTH`s and `SELECT`s as the node's URL says.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // A password and a database in the URL: the handshake sends AUTH and SELECT.
//! let redlock = tower_redlock::Redlock::builder(["redis://:secret@127.0.0.1:6379/2"]).build()?;
//! let lock = redlock.lock("invoice:42").await?;
//! redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use redis::{RedisError, RedisResult};

use super::Wire;

/// The address of `client` when our own connection can serve it: plain TCP speaking RESP2.
pub(crate) fn plain_tcp(client: &redis::Client) -> Option<(&str, u16)> {
    let info = client.get_connection_info();
    match info.addr() {
        redis::ConnectionAddr::Tcp(host, port)
            if info.redis_settings().protocol() == redis::ProtocolVersion::RESP2 =>
        {
            Some((host.as_str(), *port))
        }
        _ => None,
    }
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
