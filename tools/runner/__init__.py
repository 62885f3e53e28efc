"""The candidate's side: its runner process, the submission's import, and the protocol to the judge."""
