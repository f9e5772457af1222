package stubmodel

import "net/http"

// openai serves its vendor's API (written by the openai helper).
func (s *Server) openai(w http.ResponseWriter, r *http.Request) { s.other(w, r) }
