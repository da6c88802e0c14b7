// Package console is Keyline's web console: HTML pages served on the broker's
// --http listener at /, next to the admin API they are built on.
//
// The package knows nothing of mochi or bbolt. It declares what it needs as
// Backend, whose methods return the admin API's wire types (package
// internal/adminapi); the broker implements it from the same functions that
// serve /api/v1, so a page and the matching API call always agree.
//
// Pages: Overview (/), Groups (/groups, /groups/view), Dead letters (/dlq,
// /dlq/letter), Clients (/clients, /clients/view), Topics (/topics) and
// Bridges (/bridges), plus
// a confirmation page (/confirm) before every action (/actions/...) and the
// login page (/login).
//
// How it is built:
//   - Pages are rendered on the server with html/template; every value a
//     client controls (client ids, topics, keys, payloads, group names)
//     passes through html/template's contextual escaping, payloads are shown
//     as text or as a hex dump, never as markup.
//   - A little hand-written JavaScript (static/console.js, served as a file:
//     the Content-Security-Policy allows no inline script or style) polls the
//     JSON API to keep figures and SVG charts live, and reads the topic
//     stream (server-sent events) on the Topics page. Everything works
//     without it except the live updates. All assets are embedded; nothing
//     is fetched from elsewhere.
//   - Actions (replay, purge, delete a group, disconnect a client) are a GET
//     confirmation page and then a POST form. The broker's HTTP handler
//     refuses cross-origin POSTs (net/http's CrossOriginProtection) and needs
//     the token for every page when one is set; the backend logs each action
//     with the remote address.
//   - A browser cannot send a bearer header when it navigates, so /login
//     checks the token once and starts a session (auth.go): a random id in
//     an HttpOnly, SameSite=Strict cookie (adminapi.SessionCookie) that the
//     broker accepts like the header, until it expires (SessionTTL) or
//     /logout ends it. Every token check, login or bearer, passes one gate
//     that spaces wrong answers (GuessSpacing).
//
// Lists that can be long are paged: groups and clients 100 to a page, dead
// letters 50 (by id, forwards).
package console
