"""What people attach besides pictures, turned into text the model reads: voice notes
(transcription.py) and documents (documents.py, read in a process of their own by apart.py;
what Kaiwa reads and its caps in formats.py, which loads neither pypdf nor python-docx), and the
part that screens them before they are recorded and reads them as their turn opens (reading.py).

Pictures are not here: they go to a vision model as they are. What is here takes what a channel
describes and downloads (`core.channel.Attachment`, `core.channel.Files`) and gives back text,
or a refusal in words for the person; it imports nothing of the bot or the channels.
"""
