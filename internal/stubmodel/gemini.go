package stubmodel

import "net/http"

// gemini serves its vendor's API (written by the gemini helper).
func (s *Server) gemini(w http.ResponseWriter, r *http.Request) { s.other(w, r) }
