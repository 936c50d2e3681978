//! The tenants' result caches (`tf:cache:{<tenant>}:<digest>`): a string per
//! cached result, the envelope's JSON, expiring with the tool's cache TTL
//! (`crate::result_cache` says which calls and keys).

use redis::AsyncCommands;

use crate::result_cache::CacheEntry;

use super::*;

impl JobStore {
    /// The text cached under `entry`, if any.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub(crate) async fn cached_result(&self, entry: &CacheEntry) -> Result<Option<String>, Error> {
        let key = self.keys.tenant_cached_result(&entry.tenant, &entry.digest);
        Ok(read_with_retry(|| async { self.conn().get(&key).await }).await?)
    }

    /// Caches `text` under `entry` for its TTL, over whatever was there: the
    /// newest result of the same call answers the next ones.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub(crate) async fn cache_result(&self, entry: &CacheEntry, text: &str) -> Result<(), Error> {
        let ttl_ms = u64::try_from(entry.ttl.as_millis()).unwrap_or(u64::MAX);
        let key = self.keys.tenant_cached_result(&entry.tenant, &entry.digest);
        let () = self.conn().pset_ex(key, text, ttl_ms).await?;
        Ok(())
    }
}
