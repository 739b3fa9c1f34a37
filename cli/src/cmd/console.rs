//! `gpux console` and `gpux config`: the web console's login link, and the node's settings.

use std::path::Path;

use gpux_client::ApiClient;
use gpux_protocol::MicroCredits;

use super::{out, print_json};

/// Prints a one-time link that signs a browser on this machine into the console.
pub(crate) fn console(dir: &Path, json: bool) -> anyhow::Result<()> {
    let login = ApiClient::for_data_dir(dir)?.console_login()?;
    if json {
        return print_json(&login);
    }
    out!(
        "Open this link in a browser on this machine (it works once, within {} s):\n  {}",
        login.expires_in_s,
        login.url
    )?;
    Ok(())
}

fn print_settings(settings: &gpux_api::Settings, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(settings);
    }
    let cap = settings.spend_cap_micro.map_or_else(
        || "off".to_string(),
        |c| format!("{} credits", MicroCredits(c).amount_text()),
    );
    out!(
        "spend-cap  {cap}  (open leases commit {} credits)",
        MicroCredits(settings.committed_micro).amount_text()
    )?;
    Ok(())
}

/// `gpux config get`.
pub(crate) fn get(dir: &Path, json: bool) -> anyhow::Result<()> {
    print_settings(&ApiClient::for_data_dir(dir)?.settings()?, json)
}

/// `gpux config set NAME VALUE`.
pub(crate) fn set(dir: &Path, name: &str, value: &str, json: bool) -> anyhow::Result<()> {
    print_settings(
        &ApiClient::for_data_dir(dir)?.set_setting(name, value)?,
        json,
    )
}
