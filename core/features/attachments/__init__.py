"""What people attach besides pictures, turned into text the model reads: documents
(documents.py) and voice notes (transcription.py)."""
