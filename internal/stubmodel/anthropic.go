package stubmodel

import "net/http"

// anthropic serves its vendor's API (written by the anthropic helper).
func (s *Server) anthropic(w http.ResponseWriter, r *http.Request) { s.other(w, r) }
