//! The status page at `/ui`: one HTML page, a script and a style sheet, all inside the
//! binary (no CDN, works offline), served with a strict Content-Security-Policy. The page
//! reads the API with the token the user gives it (kept in the tab's session storage and
//! sent as the `Authorization` header, never a cookie) and follows `GET /v1/events`.

use actix_web::{HttpResponse, web};

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

/// Only the page's own files; no inline script or style, no framing, no form posts.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header(("Content-Security-Policy", CONTENT_SECURITY_POLICY))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .insert_header(("Referrer-Policy", "no-referrer"))
        .insert_header(("Cache-Control", "no-cache"))
        .body(body)
}

/// `GET /`: to the status page.
pub async fn root() -> HttpResponse {
    HttpResponse::Found()
        .insert_header(("Location", "/ui"))
        .finish()
}

/// `GET /ui`: the page.
pub async fn index() -> HttpResponse {
    asset("text/html; charset=utf-8", INDEX)
}

/// `GET /ui/app.js`.
pub async fn script() -> HttpResponse {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /ui/app.css`.
pub async fn style() -> HttpResponse {
    asset("text/css; charset=utf-8", STYLE)
}

/// The page's routes.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(root))
        .route("/ui", web::get().to(index))
        .route("/ui/", web::get().to(index))
        .route("/ui/app.js", web::get().to(script))
        .route("/ui/app.css", web::get().to(style));
}
