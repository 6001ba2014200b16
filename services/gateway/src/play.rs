//! `/play` on every gateway's admin port: a page to play in the browser over the gateway's
//! WebSocket front (canvas, arrow keys or WASD, chat, the line that says when the connection
//! is resuming). Its script is the TypeScript SDK and `clients/typescript/play/main.ts`,
//! bundled by esbuild (`npm run bundle:play` there; the test suite checks the committed
//! bundle is what the sources make) and embedded here: the page loads nothing else.

const PAGE: &str = include_str!("play.html");
const SCRIPT: &str = include_str!("play.js");

/// The page, telling its script the WebSocket front's port (0 when this gateway has none:
/// the page then needs `?ws=URL`).
pub fn page(ws_port: Option<u16>) -> String {
    PAGE.replace("/*WS_PORT*/7778", &ws_port.unwrap_or(0).to_string()).replace("/*SCRIPT*/", SCRIPT)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_page_carries_its_script_and_port() {
        let page = super::page(Some(7900));
        assert!(page.contains("window.MERIDIAN_WS_PORT = 7900;"));
        assert!(page.contains(super::SCRIPT));
        assert!(!super::SCRIPT.contains("</script"), "the script cannot end its own tag");
    }
}
