//! What every console page shares: the frame around a page, and the time.

use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

/// A rendered page.
pub(crate) struct Page(pub(crate) Markup);

impl IntoResponse for Page {
    fn into_response(self) -> Response {
        Html(self.0.into_string()).into_response()
    }
}

impl Page {
    pub(crate) fn into_string(self) -> String {
        self.0.into_string()
    }
}

/// Now, milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `ms` (since the Unix epoch) as RFC 3339 UTC, to the second.
pub(crate) fn utc(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(at).to_string()
}

/// `body` in the console's frame: the head, the navigation and the sign-out form.
pub(crate) fn layout(title: &str, csrf: Option<&str>, body: Markup) -> Page {
    Page(html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "gpux · " (title) }
                link rel="stylesheet" href="/console/style.css";
                script src="/console/app.js" defer {}
            }
            body {
                header {
                    strong { "gpux" }
                    nav {
                        a href="/console/" { "Overview" }
                        a href="/console/market" { "Market" }
                        a href="/console/rent" { "Rent" }
                        a href="/console/estimate" { "Estimate" }
                    }
                    @if let Some(csrf) = csrf {
                        form.signout method="post" action="/console/logout" {
                            input type="hidden" name="csrf" value=(csrf);
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    })
}
