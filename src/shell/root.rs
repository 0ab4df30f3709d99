//! The root context: parses the plugin configuration once per VM, creates
//! the keys' rate-limit entries before the VM serves, and makes one HTTP
//! context per stream: a [`Stream`] downstream, or an [`Attempt`] per router
//! attempt when the plugin is the upstream role (`{"role": "upstream"}`).

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;

use super::attempt::Attempt;
use super::host::{self, Buffer};
use super::http::Stream;
use crate::config::Config;

#[derive(Default)]
pub struct Root {
    config: Option<Rc<Config>>,
    upstream: bool,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        let raw = match host::buffer(Buffer::PluginConfiguration, 0, size) {
            Ok(raw) => raw,
            Err(status) => {
                log::error!("cannot read the plugin configuration (status {})", status.0);
                return false;
            }
        };
        if Config::is_upstream_role(&raw) {
            self.upstream = true;
            return true;
        }
        // The VM's environment is Envoy's `vm_config.environment_variables`.
        let env = |name: &str| std::env::var(name).ok();
        match Config::parse(&raw, &env) {
            Ok(config) => {
                for p in config.providers.iter().filter(|p| p.credential.is_none()) {
                    log::warn!(
                        "provider {} has no credential ({} is unset); it will not be used",
                        p.id,
                        p.credential_source
                    );
                }
                if config.limits == crate::config::Limits::Local {
                    crate::limits::prepare(&mut host::SharedData, &config.keys);
                }
                if config.health.enabled {
                    crate::health::prepare(&mut host::SharedData, &config.providers);
                }
                crate::inflight::prepare(&mut host::SharedData, &config);
                self.config = Some(Rc::new(config));
                true
            }
            Err(problems) => {
                for problem in problems {
                    log::error!("configuration refused: {problem}");
                }
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        if self.upstream {
            return Some(Box::new(Attempt::default()));
        }
        // No config means on_configure refused, and Envoy never gets here.
        let config = self.config.as_ref()?;
        Some(Box::new(Stream::new(Rc::clone(config))))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
